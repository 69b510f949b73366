"""DDP's building block: gradient buckets, each one flat buffer and one all-reduce.

Buckets let many small gradients travel as a few large messages. One all-reduce per
parameter pays the per-message latency once per tensor; a single all-reduce of the
whole model cannot start before backward ends. Buckets of a few megabytes sit in
between: the first buckets travel while backward still computes.
"""

from __future__ import annotations

import itertools
import typing
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from distcourse.clock import DeviceTimer, Stamp
from distcourse.comm.agree import Group


def assign_buckets(params: list[nn.Parameter], cap_bytes: int) -> list[list[int]]:
    """Group parameter indices into buckets of about `cap_bytes`, last parameter first.

    Backward produces gradients from the last layer to the first, so filling buckets
    in reverse parameter order lets bucket 0 fill (and travel) first. A bucket closes
    once it holds `cap_bytes` or more, so a large parameter may overshoot the cap and a
    tiny cap gives one parameter per bucket, as in torch's DDP. A bucket holds one
    dtype and device only, because it is one flat tensor.
    """
    groups: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i in reversed(range(len(params))):
        param = params[i]
        if current and not _same_kind(param, params[current[0]]):
            groups.append(current)
            current, size = [], 0
        current.append(i)
        size += param.numel() * param.element_size()
        if size >= cap_bytes:
            groups.append(current)
            current, size = [], 0
    if current:
        groups.append(current)
    return groups


def _same_kind(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.device == b.device


class Bucket:
    """The gradients of a few parameters, packed in one flat buffer for one all-reduce.

    Parameter `slot` of the bucket owns `buffer[offsets[slot]:offsets[slot + 1]]`.
    `ready[slot]` turns True when its gradient has been copied in during backward.
    Bucket `index` of `count` (all ranks launch them in index order). Times are
    `timer`'s (its own DeviceTimer unless given): `launched_at` is when its
    all-reduce started, `wait()` gives the Stamp of its completion on the device.
    """

    def __init__(
        self,
        index: int,
        params: list[nn.Parameter],
        count: int = 1,
        timer: DeviceTimer | None = None,
    ) -> None:
        self.index = index
        self.count = count
        self.params = params
        self.offsets = [0, *itertools.accumulate(p.numel() for p in params)]
        dtype, device = params[0].dtype, params[0].device
        self.buffer = torch.zeros(self.offsets[-1], dtype=dtype, device=device)
        self.ready = [False] * len(params)
        self.timer = DeviceTimer(device) if timer is None else timer
        self.launched: Stamp | None = None  # its all-reduce's start
        self.done: torch.futures.Future | None = None  # resolves to completion Stamp

    @property
    def launched_at(self) -> float:
        """When its all-reduce started, in `timer.time` seconds."""
        assert self.launched is not None, "launched_at before launch()"
        return self.timer.time(self.launched)

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()

    def view(self, slot: int) -> torch.Tensor:
        """Parameter `slot`'s part of the buffer, shaped like the parameter."""
        start, end = self.offsets[slot], self.offsets[slot + 1]
        return self.buffer[start:end].view_as(self.params[slot])

    def is_full(self) -> bool:
        return all(self.ready)

    def reset(self) -> None:
        """Forget the last backward: no gradient is in, no all-reduce is in flight."""
        self.ready = [False] * len(self.params)
        self.done = None

    def launch(self, group: Group, hook: CommHook | None = None) -> None:
        """Start summing the buffer over the ranks; return at once (async_op=True).

        With a comm hook `(state, fn)`, `fn(state, GradBucket view of this bucket)`
        sends the buffer instead; the tensor its future holds is copied back into
        the buffer when it completes (as torch's reducer does).
        """
        self.launched = self.timer.stamp()  # read later: no synchronize here
        if hook is None:
            work = dist.all_reduce(self.buffer, group=group, async_op=True)
            self.done = self.timer.completion(work)  # a device event on a GPU
            return
        state, fn = hook
        future = fn(state, GradBucket(self, is_last=self.index == self.count - 1))
        if not callable(getattr(future, "then", None)):  # torch.futures.Future, C++'s
            raise TypeError(
                f"comm hook must return a torch.futures.Future, got {future!r}"
            )
        self.done = future.then(self._write_back)

    def _write_back(self, future: torch.futures.Future) -> Stamp:
        """The hook's result into the buffer (unless it is the buffer); the Stamp
        of completion (on a GPU a device event, as in `DeviceTimer.completion`)."""
        value = future.value()
        result = value[0] if isinstance(value, (list, tuple)) else value
        if (
            not isinstance(result, torch.Tensor)
            or result.numel() != self.buffer.numel()
        ):
            raise ValueError(
                f"comm hook of bucket {self.index}: the future must hold one tensor of "
                f"{self.buffer.numel()} elements, got {result!r:.80}"
            )
        if result.data_ptr() != self.buffer.data_ptr():
            self.buffer.copy_(result.view_as(self.buffer))
        return self.timer.stamp()

    def wait(self) -> Stamp:
        """Block until the all-reduce has completed; return the Stamp of when it
        completed (`self.timer.time(stamp)`: seconds)."""
        assert self.done is not None, "wait() before launch()"
        return self.done.wait()


CommHook = tuple[Any, Callable[[Any, Any], torch.futures.Future]]  # (state, hook)


class GradBucket:
    """What a comm hook sees of our Bucket: the methods of torch's dist.GradBucket.

    `buffer()` is the flat gradient buffer itself (not divided by the world size, as
    in torch: the hook averages), `gradients()` views of it shaped like
    `parameters()`; `set_buffer(t)` copies `t` into it.
    """

    def __init__(self, bucket: Bucket, is_last: bool) -> None:
        self.bucket = bucket
        self.last = is_last

    def index(self) -> int:
        return self.bucket.index

    def buffer(self) -> torch.Tensor:
        return self.bucket.buffer

    def set_buffer(self, tensor: torch.Tensor) -> None:
        self.bucket.buffer.copy_(tensor.view_as(self.bucket.buffer))

    def parameters(self) -> list[nn.Parameter]:
        return list(self.bucket.params)

    def gradients(self) -> list[torch.Tensor]:
        return [self.bucket.view(slot) for slot in range(len(self.bucket.params))]

    def is_last(self) -> bool:
        return self.last


def watch_torch_buckets(ddp: DistributedDataParallel | Any) -> list[list[int]]:
    """Record the size of every bucket torch's DDP all-reduces, step by step.

    torch's reducer packs and sends its buckets from C++, unseen by Python, and
    rebuilds them after the first step (in the order the gradients arrived, the first
    one capped at 1 MiB). Its comm hook is the one place where Python sees each
    bucket: this registers one that appends the bucket's bytes to the returned list,
    a new inner list per backward (bucket 0 launches first), then all-reduces the
    average exactly as DDP's default does. Call it before the first backward. Our
    `DDP` takes the same hook, so it works on either DDP.
    """
    steps: list[list[int]] = []

    def record(
        group: dist.ProcessGroup, bucket: dist.GradBucket
    ) -> torch.futures.Future[torch.Tensor]:
        if bucket.index() == 0:
            steps.append([])
        buffer = bucket.buffer()
        steps[-1].append(buffer.numel() * buffer.element_size())
        return allreduce_hook(group, bucket)

    # torch checks the hook's annotations against the classes, not their names
    record.__annotations__ = typing.get_type_hints(record)
    ddp.register_comm_hook(ddp.process_group, record)
    return steps
