"""The most tensor memory alive at once during a block of code, on any device.

Chapter 10's planner predicts a rank's peak bytes; this measures them. On a GPU,
`torch.cuda.max_memory_allocated` counts every allocation (the emulated device's
module counts the same way: `emulate.counters`). A CPU has no such counter, so
`PeakMemory` counts one itself: a `TorchDispatchMode` sees every operator's
outputs, and each distinct storage among them is added when it first appears and
subtracted when torch frees it (`weakref.finalize`). Views share their base's
storage and count once; an in-place op allocates nothing.

What it does not see: memory a library allocates outside torch's operators (gloo's
own send and receive buffers, BLAS workspaces), and tensors alive before the block
that the block frees, unless they are named in `held`: then their freeing counts.
A GPU's number differs from the CPU's by what its allocator rounds and caches, and
by kernels that need workspaces: compare them with a tolerance, not exactly.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from types import TracebackType
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from distcourse import emulate


class _StorageCounter(TorchDispatchMode):
    """Counts the distinct storages behind every operator's tensor outputs."""

    def __init__(self, meter: PeakMemory) -> None:
        super().__init__()
        self.meter = meter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self.meter.track(leaf)
        self.meter.sample()
        return out


class PeakMemory:
    """`with PeakMemory(device, held) as m: ...`; then `m.peak`: the most bytes
    alive at once above what was alive at the start, and `m.end`: what is alive
    above it at the end (both lowered by tensors of `held` the block frees).

    `held`: tensors alive before the block that it may free or shrink (a step that
    sets gradients to None, FSDP's `storage.resize_(0)`); their storages are
    watched from the start. Every storage is read at its current size at each
    operator, so a storage resized in place (FSDP frees and refills its gathered
    buffers so) counts what it holds now. On a device other than the CPU the device
    module's allocator counters are read instead, and `held` is not needed.
    `sample()` reads the count now (a caller may sample between operators).
    """

    def __init__(self, device: torch.device, held: Iterable[torch.Tensor] = ()) -> None:
        self.device = torch.device(device)
        # the emulated GPU's counters do not follow a storage resized in place
        self.counted_here = self.device.type in ("cpu", emulate.DEVICE_TYPE)
        self.held = [t for t in held if isinstance(t, torch.Tensor)]
        self.peak = self.end = 0
        self.storages: dict[int, weakref.ref] = {}  # a StorageImpl's address -> it
        self.baseline = 0  # bytes of `held` at the start
        self.mode: TorchDispatchMode | None = None
        self.start = 0

    def track(self, tensor: torch.Tensor) -> None:
        """Watch `tensor`'s storage while it lives (once, however many views).
        A meta tensor has none: its storage reports the bytes it would hold."""
        if tensor.is_meta:
            return
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):  # no storage of its own
            return
        key = storage._cdata
        if key not in self.storages:
            self.storages[key] = weakref.ref(storage)
            weakref.finalize(storage, self.storages.pop, key, None)

    def live(self) -> int:
        """Bytes of the watched storages now, less `held`'s at the start."""
        alive = (ref() for ref in list(self.storages.values()))
        return sum(s.nbytes() for s in alive if s is not None) - self.baseline

    def sample(self) -> int:
        """The count now; the peak follows it."""
        now = self.live()
        self.peak = max(self.peak, now)
        return now

    def restart(self) -> None:
        """Count the peak afresh from now (from what is alive now)."""
        if self.counted_here:
            self.peak = self.live()
        else:
            torch.get_device_module(self.device).reset_peak_memory_stats()

    def __enter__(self) -> PeakMemory:
        if self.counted_here:
            for tensor in self.held:
                self.track(tensor)
            self.held = []  # watched by weak reference only: they may be freed
            self.baseline = self.live()
            self.mode = _StorageCounter(self)
            self.mode.__enter__()
        else:
            module: Any = torch.get_device_module(self.device)
            module.synchronize()
            module.reset_peak_memory_stats()
            self.start = module.memory_allocated()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self.mode is not None:
            self.mode.__exit__(kind, error, trace)
            self.mode = None
            self.end = self.sample()
            return
        module: Any = torch.get_device_module(self.device)
        module.synchronize()
        self.peak = module.max_memory_allocated() - self.start
        self.end = module.memory_allocated() - self.start
