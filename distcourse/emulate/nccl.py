"""NCCL's rules on top of gloo: a Python c10d backend for emulated GPU ranks (issue 36).

`register()` adds the backend BACKEND ("emunccl") for the emulated device type, so
`init_process_group("gpu:emunccl")` or `dist.new_group(backend="gpu:emunccl")` gives a
group whose every op -- the package's `dist.*` calls, DDP's C++ reducer, DTensor's
functional collectives, FSDP2, `batch_isend_irecv` -- reaches `EmulatedNccl`: a
`torch.distributed.ProcessGroup` written in Python (the pattern of torch's own
test/distributed/test_c10d_pypg.py, which runs DDP on one) that checks NCCL's rules,
unwraps device tensors to their host data and runs an inner gloo group made on a
PrefixStore of the same store. The rules, each from NCCL's or torch's documentation:

1. Host tensors are refused: the group knows only the device type, so c10d itself
   raises NCCL's "No backend type associated with device type cpu" (as chapter 2's
   `dist.send` of a host tensor did on a GPU box, DESIGN.md).
2. Tags are ignored: torch's docs of `send`/`isend` ("tag ... not supported by the
   NCCL backend"; pytorch/pytorch#94819): messages between a pair match in issue
   order. Here the n-th send from a rank to a peer always meets the peer's n-th
   receive from it; when their tags or shapes disagree the receive raises RULE_TAGS
   (NCCL would deliver the wrong data silently) -- an error rather than wrong data.
3. Issue order and the eager size: NCCL's point-to-point guide ("Point-to-point
   communication": ops between two ranks must be matched, and a send blocks until
   its receive is posted unless grouped) and NVIDIA/nccl#479 (rank 0 send, recv
   against rank 1 send, recv hangs for large buffers; group them). Each group's ops
   run in issue order on one emulated stream; a send larger than EAGER_BYTES (NCCL's
   default buffer NCCL_BUFFSIZE, 4 MiB; the variable DISTCOURSE_NCCL_EAGER_BYTES
   overrides) starts only when the peer's stream reaches the matching receive, and
   waiting longer than the group's timeout raises RULE_ORDER naming both ranks, the
   op and the shape. The ops of one `batch_isend_irecv` (NCCL's group) run as one:
   all their receives are posted before any send waits.
4. `ReduceOp.AVG` (NCCL has it since 2.10; gloo has not): a SUM, then a division.
5. A work completes, seen from the host, at enqueue (torch's docs of
   `Work.get_future`): every op is counted by `timing.note_device_work`, and the
   package's clock refuses to read while work is pending (`distcourse.emulate.timing`).
6. An op's outputs are valid only after its `wait()` and its inputs may not change
   before it (torch.distributed's docs of async_op and of isend): each op's outputs
   hold poison until then, and reading them or changing its inputs raises
   (`distcourse.emulate.completion`). A sync op is waited for by c10d at once.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

import distcourse.emulate as _device
from distcourse.emulate import completion, recorder, timing
from distcourse.emulate.p2p import (
    HeldWork,
    PointToPoint,
    describe,
    done,
    refuse_host,
)

BACKEND = "emunccl"
C10D_NAMES = {  # what each op is called among c10d's dispatched ops on a GPU
    "all_reduce": "allreduce_",
    "reduce": "reduce_",
    "broadcast": "broadcast_",
    "all_gather": "allgather_",
    "all_gather_into_tensor": "_allgather_base_",
    "reduce_scatter_tensor": "_reduce_scatter_base_",
    "all_to_all_single": "alltoall_base_",
    "all_to_all": "alltoall_",
    "gather": "gather_",
    "scatter": "scatter_",
}
_SUM, _AVG = dist.ReduceOp.SUM, dist.ReduceOp.AVG


def register() -> None:
    """Make BACKEND known to torch.distributed for the emulated device (idempotent)."""
    _device.setup()
    # c10d binds `init_process_group(device_id=...)` to the group it made first,
    # which a Python group replaces; then every barrier warns that it "uses the
    # device under current context" (c10d: barrier). The emulated barrier uses no
    # device, so the advice to bind one does not apply here.
    warnings.filterwarnings("ignore", "barrier\\(\\): using the device under current")
    if not hasattr(dist.Backend, BACKEND.upper()):
        dist.Backend.register_backend(BACKEND, _create, devices=[_device.DEVICE_TYPE])


def _create(store: Any, rank: int, size: int, timeout: timedelta) -> EmulatedNccl:
    return EmulatedNccl(store, rank, size, timeout)


def _pairwise(single: Callable, outputs: list, inputs: list, opts: Any) -> dist.Work:
    """A coalesced call as torch hands it over: `single` on each (output, input)
    pair, one Work that waits for them all."""
    pairs = zip(outputs, inputs, strict=True)
    return HeldWork.joined([single(o, i, opts) for o, i in pairs])


class EmulatedNccl(PointToPoint, dist.ProcessGroup):
    """One group of emulated NCCL ranks; see the module docstring for its rules."""

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(rank, size)
        self._me, self._size, self._timeout = rank, size, timeout
        self._gloo = dist.ProcessGroupGloo(
            dist.PrefixStore("emunccl/gloo", store), rank, size, timeout
        )
        self._store = dist.PrefixStore("emunccl/p2p", store)
        self._stream = ThreadPoolExecutor(1, thread_name_prefix=f"emunccl{rank}")
        self._sent: dict[int, int] = {}
        self._received: dict[int, int] = {}
        self._batch: list[tuple] | None = None
        self._eager: list = []
        self._name = ""
        self.track()

    def _host(self, t: torch.Tensor, op: str | None = None) -> torch.Tensor:
        """The host data of a device tensor; a host tensor gets NCCL's refusal,
        naming `op` (default: the calling method's name)."""
        if op is None:
            frame = sys._getframe(1)
            while frame.f_back is not None and frame.f_code.co_name.startswith("<"):
                frame = frame.f_back  # a comprehension's frame: its op is the caller
            op = frame.f_code.co_name
        refuse_host(t, self._me, op)
        return _device.host_data(t)

    def _nested(
        self, what: str, op: str, outputs: list, inputs: list, opts: Any
    ) -> dist.Work:
        """gloo's `op` (gather, allgather, scatter) on host copies, where one side
        is a list of lists of tensors (a root's or every rank's): `_run` is given
        that side flat."""

        def hosts(given: list) -> list:
            return [
                hosts(t) if isinstance(t, list) else self._host(t, op) for t in given
            ]

        def flat(given: list) -> list:
            return [t for x in given for t in (x if isinstance(x, list) else [x])]

        h_out, h_in = hosts(outputs), hosts(inputs)
        call = getattr(self._gloo, op)
        return self._run(
            what, flat(h_out), flat(h_in), lambda: call(h_out, h_in, opts).wait()
        )

    def _set_group_name(self, name: str) -> None:
        self._name = name  # c10d names a group; a Python group keeps the name itself

    @property
    def group_name(self) -> str:
        return self._name

    @property
    def _device_types(self) -> list[torch.device]:
        """The device type only: torch's object collectives (all_gather_object,
        broadcast_object_list) then move their bytes to the device, as on NCCL."""
        return [torch.device(_device.DEVICE_TYPE)]

    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        return BACKEND

    def __repr__(self) -> str:
        return f"EmulatedNccl(rank={self._me}, size={self._size})"

    @property
    def supports_coalescing(self) -> bool:
        return True

    @property
    def supports_splitting(self) -> bool:
        """No ncclCommSplit here: c10d makes each new group from the store."""
        return False

    def _get_backend(self, device: Any) -> EmulatedNccl:
        """The group is its own backend (torch asks it whether it coalesces)."""
        return self

    # ------------------------------------------------------------ collectives ----

    def _run(
        self, what: str, outputs: list, inputs: list, fn: Any, both: list = ()
    ) -> dist.Work:
        """Count the op, run `fn` on the stream in issue order; return its work,
        whose `outputs` (host tensors) hold poison until its wait (`inputs` may not
        change before it). `both`: tensors the op reads and writes."""
        shown = [*inputs, *outputs, *both][:2]
        shapes = ", ".join(describe(t) for t in shown)
        timing.note_device_work(f"{what} of {shapes}", self._me)
        given = [*inputs, *outputs, *both]
        recorder.note_message(
            f"c10d.{C10D_NAMES[what]}", sum(t.numel() * t.element_size() for t in given)
        )
        self._stream.submit(fn).result()
        held = completion.issue(
            completion.RULE_WAIT,
            f"{what} of {shapes}",
            self._me,
            outputs=[*outputs, *both],
            inputs=[*inputs, *both],
        )
        return HeldWork([held], [*outputs, *both])

    def _reduce_op(self, opts: Any, host: list[torch.Tensor], make: Any) -> Any:
        """Options for gloo: AVG becomes SUM; returns (options, divide-after)."""
        new = make()
        for name in ("rootRank", "rootTensor", "timeout"):
            if hasattr(opts, name):
                setattr(new, name, getattr(opts, name))
        new.reduceOp = _SUM if opts.reduceOp == _AVG else opts.reduceOp
        return new, opts.reduceOp == _AVG

    def allreduce(self, tensors: list[torch.Tensor], opts: Any) -> dist.Work:
        host = [self._host(t) for t in tensors]
        o, avg = self._reduce_op(opts, host, dist.AllreduceOptions)

        def run() -> None:
            self._gloo.allreduce(host, o).wait()
            if avg:
                for h in host:
                    h.div_(self._size)

        return self._run("all_reduce", [], [], run, both=host)

    def allreduce_coalesced(self, tensors: list, opts: Any) -> dist.Work:
        return HeldWork.joined([self.allreduce([t], opts) for t in tensors])

    def reduce(self, tensors: list[torch.Tensor], opts: Any) -> dist.Work:
        host = [self._host(t) for t in tensors]
        o, avg = self._reduce_op(opts, host, dist.ReduceOptions)
        root = self._me == opts.rootRank

        def run() -> None:
            self._gloo.reduce(host, o).wait()
            if avg and root:
                host[0].div_(self._size)

        if root:
            return self._run("reduce", [], [], run, both=host)
        return self._run("reduce", [], host, run)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> dist.Work:
        host = [self._host(t) for t in tensors]
        outputs, inputs = ([], host) if self._me == opts.rootRank else (host, [])
        return self._run(
            "broadcast",
            outputs,
            inputs,
            lambda: self._gloo.broadcast(host, opts).wait(),
        )

    def allgather(self, outputs: list, inputs: list, opts: Any) -> dist.Work:
        return self._nested("all_gather", "allgather", outputs, inputs, opts)

    def all_gather_single(self, output: Any, input: Any, opts: Any) -> dist.Work:
        ho, hi = self._host(output), self._host(input)
        return self._run(
            "all_gather_into_tensor",
            [ho],
            [hi],
            lambda: self._gloo._allgather_base(ho, hi, opts).wait(),
        )

    def allgather_into_tensor_coalesced(
        self, outputs: list, inputs: list, opts: Any
    ) -> dist.Work:
        return _pairwise(self.all_gather_single, outputs, inputs, opts)

    def reduce_scatter_single(self, output: Any, input: Any, opts: Any) -> dist.Work:
        return self._reduce_scatter(self._host(output), self._host(input), opts)

    def _reduce_scatter(self, ho: Any, hi: Any, opts: Any) -> dist.Work:
        o, avg = self._reduce_op(opts, [ho], dist.ReduceScatterOptions)

        def run() -> None:
            self._gloo._reduce_scatter_base(ho, hi, o).wait()
            if avg:
                ho.div_(self._size)

        return self._run("reduce_scatter_tensor", [ho], [hi], run)

    def reduce_scatter(self, outputs: list, inputs: list, opts: Any) -> dist.Work:
        works = []
        for out, ins in zip(outputs, inputs, strict=True):
            whole = torch.cat([self._host(i).reshape(-1) for i in ins])
            works.append(self._reduce_scatter(self._host(out).view(-1), whole, opts))
        return HeldWork.joined(works)

    def reduce_scatter_tensor_coalesced(
        self, outputs: list, inputs: list, opts: Any
    ) -> dist.Work:
        return _pairwise(self.reduce_scatter_single, outputs, inputs, opts)

    def all_to_all_single(
        self, output: Any, input: Any, out_splits: list, in_splits: list, opts: Any
    ) -> dist.Work:
        ho, hi = self._host(output), self._host(input)
        return self._run(
            "all_to_all_single",
            [ho],
            [hi],
            lambda: self._gloo.alltoall_base(
                ho, hi, out_splits, in_splits, opts
            ).wait(),
        )

    def alltoall(self, outputs: list, inputs: list, opts: Any) -> dist.Work:
        h_out = [self._host(o) for o in outputs]
        h_in = [self._host(i) for i in inputs]
        whole_in = torch.cat([i.reshape(-1) for i in h_in])
        whole_out = torch.cat([o.reshape(-1) for o in h_out])
        sizes_in, sizes_out = [i.numel() for i in h_in], [o.numel() for o in h_out]

        def run() -> None:
            self._gloo.alltoall_base(
                whole_out, whole_in, sizes_out, sizes_in, opts
            ).wait()
            for o, piece in zip(h_out, whole_out.split(sizes_out), strict=True):
                o.copy_(piece.view_as(o))

        return self._run("all_to_all", h_out, h_in, run)

    def gather(self, outputs: list, inputs: list, opts: Any) -> dist.Work:
        return self._nested("gather", "gather", outputs, inputs, opts)

    def scatter(self, outputs: list, inputs: list, opts: Any) -> dist.Work:
        return self._nested("scatter", "scatter", outputs, inputs, opts)

    def barrier(self, opts: Any) -> dist.Work:
        timing.note_device_work("barrier", self._me)
        self._stream.submit(lambda: self._gloo.barrier().wait()).result()
        return done([])
