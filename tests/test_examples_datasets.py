"""The CIFAR-10 stand-in says it is one, and can be learned (random labels cannot)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from distcourse.examples import datasets, models


def test_patterns_stand_in_is_labelled_and_learnable(tmp_path: object) -> None:
    data, source = datasets.cifar10_or_patterns(root=str(tmp_path), n=256)
    assert source.startswith("stand-in, not CIFAR-10")
    x, y = data[:]
    assert x.shape == (256, 3, 32, 32) and set(y.tolist()) == set(range(10))
    torch.manual_seed(0)
    model = models.SmallCNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(6):
        for xb, yb in DataLoader(data, 32, shuffle=True):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    assert sum(losses[-4:]) / 4 < 0.8 * sum(losses[:4]) / 4  # it learns
