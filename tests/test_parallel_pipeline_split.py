"""Cutting a model into stages: by count, by measured time, and the refusals."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

from distcourse.parallel.pipeline import split


def _model(n: int = 5) -> nn.Sequential:
    return nn.Sequential(*[nn.Linear(4, 4) for _ in range(n)])


def test_split_by_count_keeps_every_layer_once_in_order() -> None:
    model = _model(5)
    stages = split.split_by_count(model, 3)
    assert [len(s) for s in stages] == [2, 1, 2]  # sizes differ by at most one
    assert [m for s in stages for m in s] == list(model)  # the same modules
    x = torch.randn(2, 4)
    y = x
    for s in stages:
        y = s(y)
    assert torch.equal(y, model(x))


def test_balance_minimises_the_slowest_stage() -> None:
    times = [5.0, 1.0, 1.0, 1.0, 4.0, 2.0, 2.0]
    for stages in (2, 3, 4):
        bounds = split.balance(times, stages)
        worst = max(sum(times[a:b]) for a, b in zip(bounds, bounds[1:], strict=False))
        best = min(  # brute force over every set of cut points
            max(sum(times[a:b]) for a, b in zip(c, c[1:], strict=False))
            for cuts in itertools.combinations(range(1, len(times)), stages - 1)
            for c in [(0, *cuts, len(times))]
        )
        assert worst == best and len(bounds) == stages + 1
    model = nn.Sequential(*[nn.Identity() for _ in times])
    # [5, 1 | 1, 1, 4 | 2, 2]: the slowest stage takes 6, as good as it gets
    assert [len(s) for s in split.split_balanced(model, 3, times)] == [2, 3, 2]


def test_layer_times_measures_each_layer() -> None:
    times = split.layer_times(_model(3), torch.randn(8, 4), repeats=2)
    assert len(times) == 3 and all(t > 0 for t in times)


def test_refusals() -> None:
    with pytest.raises(ValueError, match="cannot cut 5 layers into 6 stages"):
        split.split_by_count(_model(5), 6)
    with pytest.raises(ValueError, match="stages must be a positive integer"):
        split.split_by_count(_model(5), 0)
    with pytest.raises(TypeError, match="a pipeline splits an nn.Sequential"):
        split.split_by_count(nn.Linear(2, 2), 1)
    with pytest.raises(ValueError, match="must rise strictly from 0 to 5"):
        split.split_at(_model(5), [0, 3, 3, 5])
    with pytest.raises(ValueError, match="2 times for 5 layers"):
        split.split_balanced(_model(5), 2, [1.0, 2.0])
