"""Running a piece of torch on the host under the emulation, said aloud.

Some of torch's production modules do not run on the emulated device's tensors (what
ran and what did not, measured on 2 ranks with torch 2.14: README of this package in
`distcourse/emulate/__init__.py`). Code that uses one of them asks `host_for(what,
device)` for the device to build it on: on a real GPU or a CPU rank the answer is
`device` itself; on an emulated GPU it is the host, and the emulation prints one line
and records `what`, so a run never passes by silently skipping the GPU rules. The list
is `host_runs()`; a test or `make test-gpu` can print it at the end.
"""

from __future__ import annotations

import torch

from distcourse.emulate import device as _device

_runs: list[str] = []


def host_for(what: str, device: torch.device) -> torch.device:
    """The device to run `what` (e.g. "torch DDP") on: `device`, or the host (with a
    printed, recorded note) when `device` is an emulated GPU."""
    if torch.device(device).type != _device.DEVICE_TYPE:
        return torch.device(device)
    if what not in _runs:
        _runs.append(what)
        print(f"[emulated GPU] {what} runs on the host, not under the GPU rules")
    return torch.device("cpu")


def host_runs() -> list[str]:
    """What this process ran on the host instead of its emulated GPU, in order."""
    return list(_runs)
