"""The small models the chapters train: small enough for 2 CPU cores, real enough."""

from __future__ import annotations

import torch
from torch import nn


def toy_mlp(d_in: int = 10, d_hidden: int = 10, d_out: int = 5) -> nn.Sequential:
    """Linear(10, 10) -> ReLU -> Linear(10, 5): the quick start's model."""
    return nn.Sequential(
        nn.Linear(d_in, d_hidden), nn.ReLU(), nn.Linear(d_hidden, d_out)
    )


def digits_mlp(hidden: int = 64) -> nn.Sequential:
    """An MLP for 8x8 handwritten digits: 64 pixels in, 10 classes out."""
    return nn.Sequential(
        nn.Flatten(), nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10)
    )


def wide_mlp(width: int = 1024, depth: int = 4, d_in: int = 256) -> nn.Sequential:
    """A stack of Linear+ReLU layers with a few million parameters, for benchmarks."""
    layers: list[nn.Module] = [nn.Linear(d_in, width), nn.ReLU()]
    for _ in range(depth - 2):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, 10))
    return nn.Sequential(*layers)


class SmallCNN(nn.Module):
    """3 conv + 2 linear layers for 3x32x32 images (CIFAR-10's shape)."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),  # 16x16x16
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),  # 32x8x8
            nn.Conv2d(32, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),  # 32x4x4
        )
        self.head = nn.Sequential(
            nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class TwoDeviceToyModel(nn.Module):
    """PyTorch's model-parallel ToyModel: net1 on one device, net2 on another.

    Linear(10, 10) -> ReLU on `first`, the activations copied to `second`, then
    Linear(10, 5). One process drives both devices, and while one computes the
    other waits. On a CPU-only machine both devices are the CPU: it runs, and there
    is nothing to overlap. Same initial weights as `toy_mlp` for the same seed.
    """

    def __init__(
        self, first: torch.device | str = "cpu", second: torch.device | str = "cpu"
    ) -> None:
        super().__init__()
        self.first, self.second = torch.device(first), torch.device(second)
        self.net1 = nn.Linear(10, 10).to(self.first)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5).to(self.second)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.relu(self.net1(x.to(self.first)))
        return self.net2(h.to(self.second))  # the copy between devices


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
