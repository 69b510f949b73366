"""A generator per emulated GPU (distcourse/emulate/rng.py), seeded apart from the
host's: the same seed draws the same device numbers every run and on every device,
not the host's; the device's state is saved and restored apart from the host's."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from distcourse import emulate

emulate.setup()
GPU = torch.device(emulate.DEVICE_TYPE, 0)
gpu = torch.get_device_module(emulate.DEVICE_TYPE)


def test_device_numbers_are_not_the_hosts() -> None:
    torch.manual_seed(0)
    on_device = torch.randn(8, device=GPU).cpu()
    torch.manual_seed(0)
    on_host = torch.randn(8)
    assert not torch.equal(on_device, on_host)  # a GPU's Philox is not the CPU's MT
    torch.manual_seed(0)
    assert torch.equal(torch.randn(8, device=GPU).cpu(), on_device)  # reproducible


def test_dropout_and_randperm_draw_from_the_device() -> None:
    torch.manual_seed(1)
    host_state = torch.get_rng_state()
    mask = F.dropout(torch.ones(64, device=GPU), 0.5).cpu()
    torch.randperm(10, device=GPU)
    assert torch.equal(torch.get_rng_state(), host_state)  # the host's left alone
    torch.manual_seed(1)
    assert torch.equal(F.dropout(torch.ones(64, device=GPU), 0.5).cpu(), mask)


def test_the_device_state_is_its_own() -> None:
    torch.manual_seed(2)
    saved_host, saved_device = torch.get_rng_state(), gpu.get_rng_state(GPU)
    first = torch.rand(4, device=GPU).cpu()
    torch.set_rng_state(saved_host)  # a checkpoint that forgets the device's state
    assert not torch.equal(torch.rand(4, device=GPU).cpu(), first)
    gpu.set_rng_state(saved_device, GPU)  # one that keeps it
    assert torch.equal(torch.rand(4, device=GPU).cpu(), first)
    assert gpu.initial_seed() == 2
