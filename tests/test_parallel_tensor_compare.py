"""The comparison with one process can fail: a layer without f, or without g, is
caught by a gradient or an output far beyond the tolerance."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from distcourse.examples.gpt import MLP
from distcourse.launch import spawn
from distcourse.parallel.tensor import (
    ParallelMLP,
    differences,
    gradient_differences,
    shard_of,
)

TOL = 1e-5


class _WithoutF(nn.Module):
    """A parallel MLP that forgets f: x's gradient is only this rank's part."""

    def __init__(self, twin: ParallelMLP) -> None:
        super().__init__()
        self.fc, self.proj = twin.fc, twin.proj

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(F.gelu(self.fc.local(x)))  # local: no copy_to_group


class _WithoutG(nn.Module):
    """A parallel MLP that forgets g: each rank returns its partial sum."""

    def __init__(self, twin: ParallelMLP) -> None:
        super().__init__()
        self.fc, self.proj = twin.fc, twin.proj

    def forward(self, x: Tensor) -> Tensor:
        h = F.gelu(self.fc(x))
        return F.linear(h, self.proj.weight) + self.proj.bias  # no reduce_from_group


def _three_twins() -> list[dict[str, float]]:
    torch.manual_seed(0)
    mlp, x = MLP(8), torch.randn(2, 3, 8)
    right = ParallelMLP.from_module(mlp)
    return [
        differences(mlp, twin, x)
        for twin in (right, _WithoutF(right), _WithoutG(right))
    ]


def test_missing_f_or_g_is_caught() -> None:
    for right, no_f, no_g in spawn(_three_twins, 2, timeout=20):
        assert max(right.values()) <= TOL, right
        assert no_f["output"] <= TOL and no_f["input grad"] > 1000 * TOL, no_f
        assert no_g["output"] > 1000 * TOL, no_g


def _shards() -> list[str]:
    full = torch.arange(12.0).view(3, 4)
    errors = []
    assert torch.equal(
        shard_of(full, torch.empty(3, 2)), full[:, 2 * dist.get_rank() :][:, :2]
    )
    assert torch.equal(shard_of(full, torch.empty(3, 4)), full)
    try:
        shard_of(full, torch.empty(1, 2))
    except ValueError as err:
        errors.append(str(err))
    return errors


def test_shard_of_finds_this_ranks_slice() -> None:
    for errors in spawn(_shards, 2, timeout=10):
        assert errors == ["no slice of a [3, 4] tensor is shaped [1, 2]"]


def test_one_rank_is_the_whole() -> None:
    for diffs in spawn(_three_twins, 1, timeout=20)[0]:  # no f or g is needed
        assert max(diffs.values()) == 0.0  # a group of one moves and sums nothing


def _against_torch(scale: float) -> dict[str, float]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    torch.manual_seed(0)
    mlp, x = MLP(8), torch.randn(2, 3, 8)
    ours = ParallelMLP.from_module(mlp)
    plan = {"fc": ColwiseParallel(), "proj": RowwiseParallel()}
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    theirs = parallelize_module(mlp, mesh, plan)
    ours(x).square().sum().backward()
    (theirs(x) * scale).square().sum().backward()  # scale != 1: other gradients
    return gradient_differences(ours, theirs)


def test_gradients_equal_torch_parallelize_module_and_a_difference_is_seen() -> None:
    for same in spawn(_against_torch, 2, 1.0, timeout=30):
        assert len(same) == 4 and max(same.values()) <= TOL, same
    for off in spawn(_against_torch, 2, 1.5, timeout=30):
        assert min(off.values()) > 1000 * TOL, off
