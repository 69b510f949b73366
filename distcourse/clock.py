"""Timing device work: the one place the package synchronizes and reads device time.

A GPU runs work queued by the host later, on its own streams. A host clock read right
after queueing an all-reduce measures the queueing, not the all-reduce; and a NCCL
work's future completes, seen from the host, once the work is synchronized with the
current stream, not when the GPU has finished it (torch's docs of `Work.get_future`).
So timing device work needs either a synchronize before each host clock read, or
device events recorded on the stream (CUDA events), read after a synchronize.

One path for every GPU (`distcourse.accelerator`): on CUDA and on the emulated GPU a
stamp is a device event of the device's module, and `seconds` synchronizes before
reading two of them. On the CPU (gloo ranks) work runs when it is called: a stamp is
the host's clock. Every host clock read goes through `emulate.timing.clock`, which
refuses to be read while emulated device work (compute or communication) is issued
and not synchronized (RULE_TIMING): on a GPU that read would measure enqueueing.
Everything here takes the device explicitly or uses this rank's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from distcourse import accelerator, runtime
from distcourse.emulate import timing


def _device(device: torch.device | str | None) -> torch.device:
    return runtime.device() if device is None else torch.device(device)


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait until `device` (default: this rank's) has finished the work queued on it.

    Nothing to wait for on the CPU; on a GPU (CUDA's or the emulated one) or another
    accelerator, its device module's `synchronize` (`torch.cuda.synchronize`).
    """
    device = _device(device)
    if device.type == "cpu":
        return
    accelerator.module(device).synchronize(device)


class Stamp:
    """A point in a device's stream: a device event on a GPU (CUDA's or emulated),
    else a host time taken after a synchronize (so work queued before it has
    finished)."""

    def __init__(self, device: torch.device) -> None:
        self.event: Any = None
        self.host: float | None = None
        if accelerator.is_gpu(device):
            self.event = accelerator.module(device).Event(enable_timing=True)
            self.event.record()
        else:
            synchronize(device)
            self.host = timing.clock()


class DeviceTimer:
    """Stamps on one device and the seconds between them.

        timer = DeviceTimer()
        a = timer.stamp(); work(); b = timer.stamp()
        timer.seconds(a, b)   # synchronizes once, then reads the stamps

    On a GPU, stamps are CUDA events, so stamping does not stall the stream.
    """

    def __init__(self, device: torch.device | str | None = None) -> None:
        self.device = _device(device)
        self.origin: tuple[Stamp, float] | None = None  # first event, host time

    def stamp(self) -> Stamp:
        """Mark this point of the (current) stream."""
        stamp = Stamp(self.device)
        if stamp.event is not None and self.origin is None:
            # the host's time at the first stamp: an origin for timelines (where
            # the event was enqueued), not a measurement of device work
            self.origin = (stamp, time.perf_counter())
        return stamp

    def time(self, stamp: Stamp) -> float:
        """`stamp` as a time in seconds on one axis, for timelines: the host's
        `perf_counter` on the CPU; on a GPU, the host time of this timer's first
        stamp plus the device time since it (synchronizes)."""
        if stamp.event is None:
            assert stamp.host is not None
            return stamp.host
        assert self.origin is not None
        return self.origin[1] + self.seconds(self.origin[0], stamp)

    def completion(self, work: Any) -> torch.futures.Future:
        """A future of the Stamp at which `work` (an async collective) completed.

        Stamped in a `then` callback of the work's future, which re-raises the
        work's error first. A host clock read there would be wrong on a GPU: NCCL's
        future completes, seen from the host, once the work is synchronized with
        the current stream (torch's docs of `Work.get_future`). But torch runs a
        callback with streams set as current that are synchronized with the
        future's kernels (torch's docs of `Future.then`), so the CUDA event a stamp
        records there marks the work's end on the device. On the CPU (gloo) the
        future completes when the work has, and the stamp is the host's time then.
        """

        def done(future: torch.futures.Future) -> Stamp:
            future.value()
            return self.stamp()

        return work.get_future().then(done)

    def seconds(self, start: Stamp, end: Stamp) -> float:
        """Seconds of device time from `start` to `end`."""
        if start.event is not None and end.event is not None:
            synchronize(self.device)
            return start.event.elapsed_time(end.event) / 1e3
        assert start.host is not None and end.host is not None
        return end.host - start.host


def timed(fn: Callable[[], Any], device: torch.device | str | None = None) -> float:
    """Seconds `fn()` keeps the device busy: synchronized before and after."""
    timer = DeviceTimer(device)
    start = timer.stamp()
    fn()
    return timer.seconds(start, timer.stamp())
