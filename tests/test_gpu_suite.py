"""The GPU suite's device and world sizes under each value of its variable (issue 36):
cuda runs every size up to the GPU count (8 on an 8-GPU box), an emulated box every
size, the CPU dry run 1 and 2; what `run` tells `spawn` follows the device."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent / "gpu"))
import gpu_suite  # noqa: E402  (tests/gpu is no package: its conftest imports it so)


@pytest.mark.parametrize(
    ("value", "gpus", "device", "sizes"),
    [
        ("cpu", 0, "cpu", [1, 2]),
        ("emulated", 0, "emulated", [1, 2, 4, 8]),
        (" Emulated ", 1, "emulated", [1, 2, 4, 8]),  # never cut to the real GPUs
        ("cuda", 1, "cuda", [1]),
        ("cuda", 2, "cuda", [1, 2]),
        ("cuda", 4, "cuda", [1, 2, 4]),
        ("cuda", 8, "cuda", [1, 2, 4, 8]),
        ("cuda", 16, "cuda", [1, 2, 4, 8]),
        ("", 8, "cuda", [1, 2, 4, 8]),  # unset: cuda where torch sees a GPU
        ("", 0, None, []),  # unset and no GPU: skipped
    ],
)
def test_world_sizes_follow_the_device(monkeypatch, value, gpus, device, sizes) -> None:
    monkeypatch.setenv(gpu_suite.VARIABLE, value)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    assert gpu_suite.device_type() == device
    assert gpu_suite.world_sizes() == sizes
    assert (gpu_suite.skip_reason() is None) == (device is not None)


def test_each_device_names_its_backend_and_bad_values_are_refused(
    monkeypatch,
) -> None:
    assert gpu_suite.BACKENDS == {"cuda": "nccl", "emulated": "emulated", "cpu": "gloo"}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setenv(gpu_suite.VARIABLE, "cuda")
    with pytest.raises(RuntimeError, match="torch sees no CUDA device"):
        gpu_suite.world_sizes()  # a GPU check never skips itself on a broken box
    monkeypatch.setenv(gpu_suite.VARIABLE, "gpu")
    with pytest.raises(ValueError, match="use 'cuda', 'emulated' or 'cpu'"):
        gpu_suite.device_type()
