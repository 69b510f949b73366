"""Which emulated GPU is this process's: the device type, the host's count, the
current index. The lowest module of the emulation: the device (its tensors and
kernels) and the device module (`torch.gpu`) both read it, and it imports neither.
"""

from __future__ import annotations

import os

import torch

DEVICE_TYPE = "gpu"  # what the renamed PrivateUse1 key is called: gpu:<local rank>
COUNT_VARIABLE = "DISTCOURSE_EMULATED_GPUS"  # devices per host; else the local world
_current = {"index": 0, "count": 0}


def device_count() -> int:
    """Emulated GPUs on this host: set_device_count(), else DISTCOURSE_EMULATED_GPUS,
    else torchrun's LOCAL_WORLD_SIZE, else 1 (one GPU per local rank, as NCCL needs)."""
    if _current["count"]:
        return _current["count"]
    for name in (COUNT_VARIABLE, "LOCAL_WORLD_SIZE"):
        if os.environ.get(name, "").strip().isdigit():
            return max(1, int(os.environ[name]))
    return 1


def set_device_count(count: int) -> None:
    """Say how many emulated GPUs this host has (the runtime passes the local world)."""
    if count < 1:
        raise ValueError(f"an emulated host needs at least one GPU, not {count}")
    _current["count"] = count


def current_device() -> int:
    """Index of this process's current emulated GPU."""
    return _current["index"]


def set_device(device: torch.device | str | int) -> None:
    """Make `device` current, as `torch.cuda.set_device`; refuse an index past the
    host's count, as CUDA does ("invalid device ordinal")."""
    index = device if isinstance(device, int) else torch.device(device).index
    index = 0 if index is None else index
    if not 0 <= index < device_count():
        raise RuntimeError(
            f"{DEVICE_TYPE}:{index}: invalid device ordinal "
            f"({device_count()} emulated GPUs on this host)"
        )
    _current["index"] = index


def current() -> torch.device:
    """This process's current emulated device, e.g. `gpu:1`."""
    return torch.device(DEVICE_TYPE, current_device())
