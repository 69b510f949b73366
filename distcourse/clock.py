"""Timing device work: the one place the package synchronizes and reads device time.

A GPU runs work queued by the host later, on its own streams. A host clock read right
after queueing an all-reduce measures the queueing, not the all-reduce; and a NCCL
work's future completes, seen from the host, once the work is synchronized with the
current stream, not when the GPU has finished it (torch's docs of `Work.get_future`).
So timing device work needs either a synchronize before each host clock read, or
device events recorded on the stream (CUDA events), read after a synchronize.

On the CPU (gloo ranks) work runs when it is called and both ways agree. On the
emulated GPU rank (`DISTCOURSE_DEVICE=emulated`) the device module's `synchronize`
is counted, so the emulation can tell timed code that synchronized from code that did
not. Everything here takes the device explicitly or uses this rank's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from distcourse import runtime


def _device(device: torch.device | str | None) -> torch.device:
    return runtime.device() if device is None else torch.device(device)


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait until `device` (default: this rank's) has finished the work queued on it.

    Nothing to wait for on the CPU; on a GPU, `torch.cuda.synchronize`; on another
    accelerator (the emulated one included), its device module's `synchronize`.
    """
    device = _device(device)
    if device.type == "cpu":
        return
    torch.get_device_module(device).synchronize(device)


class Stamp:
    """A point in a device's stream: a CUDA event on a GPU, else a host time taken
    after a synchronize (so work queued before it has finished)."""

    def __init__(self, device: torch.device) -> None:
        self.event: Any = None
        self.host: float | None = None
        if device.type == "cuda":
            self.event = torch.cuda.Event(enable_timing=True)
            self.event.record()
        else:
            synchronize(device)
            self.host = time.perf_counter()


class DeviceTimer:
    """Stamps on one device and the seconds between them.

        timer = DeviceTimer()
        a = timer.stamp(); work(); b = timer.stamp()
        timer.seconds(a, b)   # synchronizes once, then reads the stamps

    On a GPU, stamps are CUDA events, so stamping does not stall the stream.
    """

    def __init__(self, device: torch.device | str | None = None) -> None:
        self.device = _device(device)

    def stamp(self) -> Stamp:
        """Mark this point of the device's stream."""
        return Stamp(self.device)

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
