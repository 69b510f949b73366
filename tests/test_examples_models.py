"""The chapters' small models: the two-device ToyModel computes what toy_mlp does."""

from __future__ import annotations

import torch

from distcourse.examples.models import TwoDeviceToyModel, toy_mlp


def test_two_device_toy_model_equals_the_one_device_mlp() -> None:
    torch.manual_seed(0)
    mlp = toy_mlp()
    torch.manual_seed(0)
    split = TwoDeviceToyModel("cpu", "cpu")  # both "devices" are the CPU here
    x = torch.randn(4, 10)
    assert torch.equal(split(x), mlp(x))
    assert split.net2.weight.device == split.second
    split(x).sum().backward()
    mlp(x).sum().backward()
    assert torch.equal(split.net1.weight.grad, mlp[0].weight.grad)
