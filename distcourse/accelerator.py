"""The one place that asks whether a device is a GPU: CUDA's, or the emulated one.

Code that branched on `device.type == "cuda"` took its other arm on the emulated GPU
box, so the GPU paths (device events, the device's generator, DDP's `device_ids`,
CUDA's attention kernels) never ran in CI. Every such question goes through here
instead, and `tests/test_accelerator.py` refuses a `== "cuda"` anywhere else (the
package, book/scripts and the notebooks' code cells). A GPU is a CUDA device or an
emulated one (`distcourse.emulate`, DISTCOURSE_DEVICE=emulated); both answer
`torch.get_device_module(device)` with the same API (`synchronize`, `Event`,
`get_rng_state`, `manual_seed`, `device_count`), so the code after the question is
one path. `is_cuda` is left for what only CUDA itself has (binding NCCL to a device
at init, whose emulated stand-in needs no binding).
"""

from __future__ import annotations

from typing import Any

import torch

from distcourse import emulate

CUDA = "cuda"
GPU_TYPES = (CUDA, emulate.DEVICE_TYPE)


def _type(device: torch.device | str) -> str:
    """The device's type; a string is read as written ("gpu:1" names the emulated
    type even before the emulation has registered it with torch)."""
    return device.type if isinstance(device, torch.device) else device.split(":")[0]


def is_gpu(device: torch.device | str) -> bool:
    """A CUDA GPU or an emulated one: the device takes the GPU paths."""
    return _type(device) in GPU_TYPES


def is_cuda(device: torch.device | str) -> bool:
    """CUDA itself (not the emulated GPU): for what only CUDA's API does."""
    return _type(device) == CUDA


def module(device: torch.device | str) -> Any:
    """The device's module (`torch.cuda`, or `torch.gpu` for the emulated one)."""
    return torch.get_device_module(torch.device(device))


def kernel_type(device: torch.device | str) -> str:
    """Whose kernels the device runs, as `distcourse.sdpa` names them: "cuda" on any
    GPU (the emulated one chooses as CUDA does), else the device's type."""
    return CUDA if is_gpu(device) else _type(device)


def dispatch_key(device: torch.device | str) -> str:
    """The dispatch key whose kernels compute on `device`: "CUDA" on a CUDA GPU,
    "CPU" on the CPU and on the emulated GPU (its kernels are the host's)."""
    return "CUDA" if is_cuda(device) else "CPU"


def ddp_device_ids(device: torch.device | str) -> list[int] | None:
    """torch DDP's `device_ids` for a module on `device`: [its index] on a GPU (one
    device per process), None on the CPU (DDP's documented values)."""
    device = torch.device(device)
    return [device.index or 0] if is_gpu(device) else None


def rng_state(device: torch.device | str) -> torch.Tensor | None:
    """The state of `device`'s own generator (a GPU's is not the host's), or None
    for the CPU (its state is `torch.get_rng_state()`)."""
    return (
        module(device).get_rng_state(torch.device(device)) if is_gpu(device) else None
    )


def set_rng_state(state: torch.Tensor | None, device: torch.device | str) -> None:
    """Restore what `rng_state(device)` saved (nothing to do for None)."""
    if state is not None and is_gpu(device):
        module(device).set_rng_state(state.cpu(), torch.device(device))


def local_gpus(count: int, preference: str | None) -> list[torch.device]:
    """`count` CUDA GPUs of this process to place modules on (chapter 4's
    two-device model), or [] where there are fewer or `preference`
    (runtime.device_preference()) asks for another device.

    The emulated box gives none: one process driving two emulated GPUs through one
    backward aborts in torch's autograd engine (its Python device guard knows a
    single device, `emulate.device.DeviceTensor.device`), so that cell takes its
    one-device arm there, and only a box with two GPUs runs it."""
    if preference in (None, CUDA) and torch.cuda.is_available():
        if torch.cuda.device_count() >= count:
            return [torch.device(CUDA, i) for i in range(count)]
    return []
