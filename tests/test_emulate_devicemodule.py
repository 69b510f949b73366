"""`torch.gpu`, the emulated device's module (distcourse/emulate/devicemodule.py):
what torch.cuda's callers find there behaves as on a GPU, within the emulation."""

from __future__ import annotations

import pytest
import torch

from distcourse import emulate
from distcourse.emulate import devicemodule

emulate.setup()
gpu = torch.get_device_module(emulate.DEVICE_TYPE)


def test_devices_count_and_switch_like_cuda() -> None:
    assert gpu.is_available() and gpu.device_count() >= 1
    devicemodule.set_device_count(2)
    gpu.set_device(1)
    assert gpu.current_device() == 1 and emulate.current() == torch.device("gpu", 1)
    assert torch.zeros(1, device="gpu").device == torch.device("gpu", 1)
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        gpu.set_device(2)
    gpu.set_device(0)


def test_synchronize_and_event_waits_are_counted() -> None:
    emulate.reset_host_syncs()
    seen: list[str] = []
    emulate.add_sync_hook(seen.append)
    start, end = gpu.Event(enable_timing=True), gpu.Event(enable_timing=True)
    start.record()
    torch.ones(4, device="gpu").sum()
    end.record()
    end.synchronize()
    gpu.synchronize()
    assert emulate.host_syncs() == 2 and seen[-2:] == [
        "Event.synchronize",
        "synchronize",
    ]
    assert start.elapsed_time(end) >= 0.0
    with pytest.raises(RuntimeError, match="enable_timing"):
        gpu.Event().elapsed_time(end)


def test_memory_counts_live_device_storage_once_per_storage() -> None:
    before = gpu.memory_allocated()
    gpu.reset_peak_memory_stats()
    x = torch.zeros(1024, device="gpu")  # 4 KiB
    views = [x[:10], x.view(32, 32)]
    assert gpu.memory_allocated() - before == 4096
    del x, views
    assert gpu.memory_allocated() == before
    assert gpu.max_memory_allocated() >= before + 4096


def test_seeding_makes_device_draws_reproducible() -> None:
    torch.manual_seed(3)
    a = torch.randn(4, device="gpu").cpu()
    gpu.manual_seed(3)
    b = torch.randn(4, device="gpu").cpu()
    assert torch.equal(a, b)


def test_a_device_block_switches_the_current_device_and_back() -> None:
    devicemodule.set_device_count(2)
    with gpu.device(1):
        assert gpu.current_device() == 1
    assert gpu.current_device() == 0
