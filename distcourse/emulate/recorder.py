"""What a run does, recorded so that two machines can be compared: a real GPU's
trace (tools/gpu_check.sh records it into tests/data/gpu_traces/) against the same
program on the emulated box (tests/test_emulate_recorder.py diffs them).

`Recorder` is a TorchDispatchMode and works on any device (CUDA, the emulated GPU,
the CPU). It keeps, in order:

- every dispatched op: its name (the overload packet's, as torch prints it), its
  tensor outputs' dtypes and shapes; size and stride queries are left out (a
  wrapper tensor asks them where a GPU tensor does not);
- the collectives and point-to-point messages, apart from the ops (c10d's ops and
  the functional collectives; the emulated NCCL group, which c10d calls directly,
  reports its own under c10d's names): their name and the bytes of their tensor
  arguments, in issue order;
- with `model=`, the bytes autograd keeps for backward, by the innermost module
  whose forward saved them (each storage once, parameters left out).

Saved-tensor hooks change what autograd dispatches (unpacking runs `detach`), so
`record(program, device)` runs one of PROGRAMS (the same code on every machine)
twice: once for the ops and messages, once for the saved bytes; it returns the
trace with its device, torch version and date. `diff` lines two op
lists up: a stretch where both ran the same ops in another order is told apart from
ops that differ, so accepted differences can be listed with their reasons.
"""

from __future__ import annotations

import datetime
import difflib
import functools
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

QUERIES = frozenset(
    {
        "is_contiguous",
        "is_non_overlapping_and_dense",
        "is_strides_like_format",
        "sym_size",
        "sym_stride",
        "sym_numel",
        "sym_storage_offset",
        "dim",
        "size",
        "stride",
        "numel",
        "storage_offset",
    }
)
MESSAGES = ("c10d", "_c10d_functional", "_c10d_functional_autograd")
_active: list[Recorder] = []  # recorders open now (the emulated group reports here)


def note_message(name: str, nbytes: int) -> None:
    """A collective or message of the emulated NCCL group, which is a Python
    ProcessGroup (c10d calls it directly, not through c10d's dispatched ops): told
    to every open recorder under the name c10d's op has on a GPU."""
    for recorder in _active:
        recorder.messages.append([name, nbytes])


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


class Recorder(TorchDispatchMode):
    """`with Recorder(model) as r: ...`; then `r.ops`, `r.messages`, `r.saved`."""

    def __init__(self, model: nn.Module | None = None) -> None:
        super().__init__()
        self.ops: list[list] = []
        self.messages: list[list] = []
        self.saved: dict[str, int] = {}
        self.model = model
        self._stack: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name in QUERIES:
            return out
        outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        if func.namespace not in MESSAGES:  # those go to `messages` alone
            self.ops.append(
                [name, [_dtype(t) for t in outs], [list(t.shape) for t in outs]]
            )
        else:
            given = [
                t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)
            ]
            size = sum(t.numel() * t.element_size() for t in given)
            self.messages.append([f"{func.namespace}.{name}", size])
        return out

    def __enter__(self) -> Recorder:
        if self.model is not None:
            self._saving = self._watch(self.model)
            self._saving.__enter__()
        _active.append(self)
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        _active.remove(self)
        if self.model is not None:
            self._saving.__exit__(*exc)

    @contextmanager
    def _watch(self, model: nn.Module) -> Iterator[None]:
        params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        seen: set[int] = set()

        def pack(t: torch.Tensor) -> torch.Tensor:
            key = t.untyped_storage().data_ptr()
            if key not in params and key not in seen and self._stack:
                seen.add(key)
                where = self._stack[-1]
                self.saved[where] = (
                    self.saved.get(where, 0) + t.untyped_storage().nbytes()
                )
            return t

        handles = []
        for name, module in model.named_modules():
            label = name or type(module).__name__
            handles.append(
                module.register_forward_pre_hook(functools.partial(self._enter, label))
            )
            handles.append(module.register_forward_hook(self._leave))
        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                yield
        finally:
            for handle in handles:
                handle.remove()

    def _enter(self, label: str, *_: Any) -> None:
        self._stack.append(label)

    def _leave(self, *_: Any) -> None:  # returns None: the output is left alone
        self._stack.pop()


def header(device: torch.device, program: str) -> dict:
    """Where and when a trace was recorded."""
    if device.type == "cpu":
        name = "CPU"
    else:
        name = torch.get_device_module(device).get_device_name(device)
    return {
        "program": program,
        "device": name,
        "torch": torch.__version__,
        "date": datetime.date.today().isoformat(),
    }


def tinygpt_autocast(device: torch.device, saved: bool = False) -> Recorder:
    """The H200 program of 2026-12-04 (tests/data/gpu_traces/): TinyGPT (vocab 64,
    16 tokens, one layer, 4 heads of 8) forward and loss under bf16 autocast, then
    backward, seeded, on `device` (`saved`: count what autograd keeps instead)."""
    from distcourse.examples.gpt import GPTConfig, TinyGPT, lm_loss

    cfg = GPTConfig(vocab=64, block_size=16, n_layer=1, n_head=4, n_embd=32)
    torch.manual_seed(0)
    model = TinyGPT(cfg).to(device)
    x = torch.randint(0, 64, (2, 16)).to(device)
    y = torch.randint(0, 64, (2, 16)).to(device)
    recorder = Recorder(model if saved else None)
    with recorder, torch.autocast(device.type, torch.bfloat16):
        loss = lm_loss(model(x), y)
    with recorder:
        loss.backward()
    return recorder


def ddp_digits(device: torch.device, saved: bool = False) -> Recorder:
    """Chapter 1's program (book/scripts/quickstart_ddp.py) for three batches on
    this rank: the digits MLP under torch DDP on the default group, which the
    caller has made (one rank per GPU)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from distcourse.examples import datasets, models

    torch.manual_seed(0)
    model = models.digits_mlp().to(device)
    ids = None if device.type == "cpu" else [device.index or 0]  # DDP's, one device
    ddp = DDP(model, device_ids=ids)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    data = datasets.digits(train=True)
    recorder = Recorder(model if saved else None)
    for step in range(3):
        rows = [data[i] for i in range(32 * step, 32 * step + 32)]
        x = torch.stack([r[0] for r in rows]).to(device)
        y = torch.tensor([int(r[1]) for r in rows]).to(device)
        optimizer.zero_grad()
        with recorder:
            loss = torch.nn.functional.cross_entropy(ddp(x), y)
            loss.backward()
        optimizer.step()
    return recorder


PROGRAMS: dict[str, Callable[[torch.device, bool], Recorder]] = {
    "tinygpt-autocast": tinygpt_autocast,
    "ddp-digits": ddp_digits,
}


def record(program: str, device: torch.device) -> dict:
    """Run PROGRAMS[program] on `device`; the trace as JSON-ready data."""
    run = PROGRAMS[program](device, False)
    return {
        **header(device, program),
        "ops": run.ops,
        "messages": run.messages,
        "saved": PROGRAMS[program](device, True).saved,
    }


def diff(ours: list[list], theirs: list[list]) -> list[dict]:
    """Where two op lists part, by (name, dtypes) (shapes too where both have
    them): each stretch that differs, marked "order" when both sides ran the same
    ops in another order, else "ops"."""

    def keys(ops: list[list]) -> list[tuple]:
        shapes = all(len(op) > 2 for op in ours) and all(len(op) > 2 for op in theirs)
        return [(op[0], tuple(op[1]), *([str(op[2])] if shapes else [])) for op in ops]

    a, b = keys(ours), keys(theirs)
    parts = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b).get_opcodes():
        if tag == "equal":
            continue
        kind = "order" if Counter(a[i1:i2]) == Counter(b[j1:j2]) else "ops"
        parts.append({"kind": kind, "ours": a[i1:i2], "theirs": b[j1:j2], "at": i1})
    return _merged(parts)


def _merged(parts: list[dict]) -> list[dict]:
    """Adjacent stretches that together are the same ops in another order (a
    SequenceMatcher splits a swap into a delete and an insert) become one."""
    out: list[dict] = []
    for part in parts:
        if out and part["kind"] == "ops" and out[-1]["kind"] == "ops":
            both = {
                "ours": out[-1]["ours"] + part["ours"],
                "theirs": out[-1]["theirs"] + part["theirs"],
                "at": out[-1]["at"],
            }
            same = Counter(both["ours"]) == Counter(both["theirs"])
            if same:
                out[-1] = {"kind": "order", **both}
                continue
        out.append(part)
    return out
