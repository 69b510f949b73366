"""Work the host reads before it is finished: completion as a GPU has it.

The emulated device runs every kernel before it returns, so a program that reads a
result too early would read the right numbers here and wrong ones on a GPU. This
module holds results back the way a GPU does, from what torch's and CUDA's
documentation say:

- RULE_WAIT. torch.distributed's docs ("Synchronous and asynchronous collective
  operations"): with async_op=True, `wait()` "in the case of CUDA collectives, will
  block the currently active CUDA stream until the operation is completed (but will
  not block the CPU)"; before it, using the output is not ordered after the
  collective. `irecv` likewise fills its buffer when its request completes. Here
  the outputs of an emulated NCCL op (a collective's output, a receive's buffer)
  hold poison from the moment it is issued -- NaN for floating types, a sentinel
  (the type's lowest value; True for bool) otherwise -- and any device op that
  reads them raises RULE_WAIT, naming the rank, the op and where it was issued and
  read, until `wait()` on its work (or `is_completed()` answering True, or a device
  `synchronize()`) writes the result in. torch runs a future's `.then()` callbacks
  with streams synchronized with the work (docs of `torch.futures.Future.then` and
  `Work.get_future`), so a work's result is written in when its future is asked for:
  a callback reads valid data, as on a GPU.
- RULE_BUFFER. torch's docs of `isend`: "Modifying tensor before the request
  completes causes undefined behavior"; NCCL reads an op's input on its own stream
  whenever the op runs. Here an op that writes into a buffer that an issued,
  unfinished op reads (a send's tensor, a collective's input) raises RULE_BUFFER at
  the line that writes it.
- RULE_COPY. torch's tutorial "A guide on good usage of non_blocking and
  pin_memory()": a device-to-host copy with non_blocking=True returns before the
  data are there, and reading them needs a synchronize first (`torch.cuda.
  synchronize()`, an event or stream synchronize, or any host sync on the stream).
  Here `t.to("cpu", non_blocking=True)` returns a host tensor that holds poison and
  raises RULE_COPY when read before one of those; a copy into a pinned host tensor
  of the program's own (`copy_(..., non_blocking=True)`) holds poison until then.

Only ops that read data are checked (views and size queries are not), and c10d's own
ops may be given pending buffers (NCCL orders its ops on its stream). The copies this
module makes are the emulation's, not the program's: dispatch modes (a trace, a
memory meter) do not see them.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes

from distcourse.emulate.regions import Regions, span

RULE_WAIT = (
    "completion rule: an async op's output is valid only after its wait() (or a "
    "device synchronize)"
)
RULE_BUFFER = (
    "buffer rule: a tensor an issued op reads must not change until the op completes"
)
RULE_COPY = (
    "non-blocking copy rule: a non_blocking device-to-host copy is valid only after "
    "a synchronize"
)

_HERE = os.path.dirname(os.path.abspath(__file__))
_lock = threading.RLock()
_outputs = Regions()  # bytes an issued op will fill
_inputs = Regions()  # bytes an issued op still reads
_copies = Regions()  # host bytes a non-blocking copy will fill
_order = itertools.count(1)


class CompletionRuleError(RuntimeError):
    """A program read work before it finished, or changed what work still reads."""


def place() -> str:
    """' at file:line in function' of the innermost caller outside torch and this
    package (the line that made the op), or '' if none."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        outside = f"{os.sep}torch{os.sep}" not in name and _HERE not in name
        if outside and frame.f_code.co_name != "__torch_dispatch__":  # not a mode
            return f" at {name}:{frame.f_lineno} in {frame.f_code.co_name}"
        frame = frame.f_back  # type: ignore[assignment]
    return ""


def _rank() -> str:
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return f"rank {dist.get_rank()}"
    return "this process"


def poison(t: torch.Tensor) -> None:
    """Fill `t` with what a GPU buffer holds before its op wrote it, as far as a
    program can tell: NaN for floating types, the lowest value otherwise."""
    if t.numel() == 0:
        return
    if t.is_floating_point() or t.is_complex():
        t.fill_(float("nan"))
    elif t.dtype == torch.bool:
        t.fill_(True)
    elif t.dtype in (torch.uint8, torch.uint16, torch.uint32, torch.uint64):
        t.fill_(torch.iinfo(t.dtype).max)
    else:
        t.fill_(torch.iinfo(t.dtype).min)


@dataclass(eq=False)
class Pending:
    """One issued op: what it will write (`outputs`, filled from `values` when it
    completes) and what it reads (`inputs`)."""

    rule: str
    what: str
    rank: int | None
    issued: str
    outputs: list[torch.Tensor] = field(default_factory=list)
    values: list[torch.Tensor] = field(default_factory=list)
    inputs: list[torch.Tensor] = field(default_factory=list)
    ready: Callable[[], Any] | None = None  # blocks until the values are there
    order: int = 0
    done: bool = False

    def who(self) -> str:
        return _rank() if self.rank is None else f"rank {self.rank}"


def issue(
    rule: str,
    what: str,
    rank: int | None,
    outputs: Iterable[torch.Tensor] = (),
    inputs: Iterable[torch.Tensor] = (),
    values: list[torch.Tensor] | None = None,
    ready: Callable[[], Any] | None = None,
) -> Pending:
    """Hold `outputs` (host tensors) back until `complete`: their values now (or
    `values`, filled by `ready()`) are kept aside and they hold poison; `inputs`
    may not change until then."""
    with _disable_current_modes():
        return _issue(rule, what, rank, list(outputs), inputs, values, ready)


def _issue(rule, what, rank, outputs, inputs, values, ready) -> Pending:  # type: ignore[no-untyped-def]
    values = [t.clone() for t in outputs] if values is None else values
    kept = [i for i, t in enumerate(outputs) if span(t) is not None]
    outputs, values = [outputs[i] for i in kept], [values[i] for i in kept]
    pending = Pending(rule, what, rank, place(), outputs, values, [], ready)
    pending.order = next(_order)
    written = {span(t) for t in outputs}
    with _lock:
        for t in outputs:
            poison(t)
            _outputs.add(t, pending)
        for t in inputs:
            if span(t) not in written and _inputs.add(t, pending):
                pending.inputs.append(t)
    return pending


def copy_issued(host: torch.Tensor, value: torch.Tensor) -> Pending:
    """A non-blocking device-to-host copy of `value` into `host` (poisoned now)."""
    pending = issue(RULE_COPY, f"copy to the host of {tuple(value.shape)}", None)
    with _disable_current_modes():
        pending.outputs, pending.values = [host], [value.clone()]
        poison(host)
    with _lock:
        _copies.add(host, pending)
    return pending


def copied_later(host: torch.Tensor, returned: bool) -> torch.Tensor:
    """A non-blocking device-to-host copy into `host` (RULE_COPY): poison until a
    synchronize; a copy that made `host` (`.to("cpu", non_blocking=True)`) returns
    it as a PendingHost, which refuses to be read before then."""
    copy_issued(host, host)
    return pending_host(host) if returned else host


def complete(pending: Pending) -> None:
    """The op is done: write its results in and free its buffers (idempotent)."""
    if pending.done:
        return
    if pending.ready is not None:
        pending.ready()
    with _lock, _disable_current_modes():
        if pending.done:
            return
        for out, value in zip(pending.outputs, pending.values, strict=True):
            out.copy_(value)
        for table in (_outputs, _inputs, _copies):
            table.drop(pending)
        pending.done = True


def complete_copies(up_to: int | None = None) -> None:
    """Finish the non-blocking copies issued before `up_to` (all by default): a
    synchronize of the stream, or of an event recorded after them, or a host sync."""
    for pending in sorted(_copies.owners(), key=lambda p: p.order):
        if up_to is None or pending.order <= up_to:
            complete(pending)


def synchronize() -> None:
    """A device synchronize: every issued op has finished."""
    everything = _outputs.owners() | _inputs.owners() | _copies.owners()
    for pending in sorted(everything, key=lambda p: p.order):
        complete(pending)


def position() -> int:
    """Where the stream is now (an event records it)."""
    return next(_order)


def busy() -> bool:
    return bool(_outputs or _inputs or _copies)


def check(func: Any, reads: Iterable[torch.Tensor], writes: Iterable[Any]) -> None:
    """Refuse `func` if it reads a buffer that is not valid yet, or writes one that
    an issued op reads or will fill."""
    for t in writes:
        reader, owner = _inputs.owner(t), _outputs.owner(t)
        owner = reader or owner
        if owner is not None:
            raise CompletionRuleError(
                f"{RULE_BUFFER if reader is not None else owner.rule}: "
                f"{owner.who()} changed a buffer of its {owner.what} (issued"
                f"{owner.issued or ' here'}) with {func}{place()} before the op "
                "completed; wait() on its work first (torch's docs of isend: "
                "modifying the tensor before the request completes is undefined)"
            )
    for t in reads:
        owner = _outputs.owner(t) or _copies.owner(t)
        if owner is not None:
            raise CompletionRuleError(_read_message(owner, str(func)))


def _read_message(owner: Pending, how: str) -> str:
    if owner.rule == RULE_COPY:
        fix = "call synchronize() (torch.cuda.synchronize) before reading it"
    else:
        fix = "call wait() on the work the op returned before reading its output"
    return (
        f"{owner.rule}: {owner.who()} read the result of its {owner.what} (issued"
        f"{owner.issued or ' here'}) with {how}{place()} before the op completed: "
        f"on a GPU this reads whatever the buffer held; {fix}"
    )


class PendingHost(torch.Tensor):
    """The host tensor a non-blocking device-to-host copy returns: reading it before
    the copy completes raises RULE_COPY; afterwards it is a plain tensor."""

    _METADATA = frozenset(  # what may be asked before the data are there
        {"__get__", "size", "dim", "numel", "stride", "is_pinned", "element_size"}
    )  # (__get__: properties such as shape, dtype, device)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = getattr(func, "__name__", "")
        with torch._C.DisableTorchFunctionSubclass():
            if name not in cls._METADATA and _copies:
                for arg in args:
                    owner = _copies.owner(arg) if isinstance(arg, cls) else None
                    if owner is not None:
                        message = _read_message(owner, name or str(func))
                        raise CompletionRuleError(message)
            return func(*args, **(kwargs or {}))

    def __reduce_ex__(self, proto: Any) -> Any:
        """Pickled as the plain tensor it is once its copy is done (torch.save,
        DCP's staging), and refused before, as any other read."""
        with torch._C.DisableTorchFunctionSubclass():
            owner = _copies.owner(self)
            if owner is not None:
                raise CompletionRuleError(_read_message(owner, "pickling"))
            plain = self.as_subclass(torch.Tensor)
        return plain.__reduce_ex__(proto)


def pending_host(host: torch.Tensor) -> torch.Tensor:
    """`host` as a PendingHost (sharing its storage)."""
    return torch.Tensor._make_subclass(PendingHost, host)
