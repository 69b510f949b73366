"""Buckets on real gloo ranks: what torch's DDP all-reduces, seen through a comm hook.

torch's reducer starts with buckets in parameter order (a 1 MiB first bucket and
25 MiB after it), then rebuilds them after the first step in the order gradients
arrived. The hook must see that, and must not change the training.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from distcourse import runtime
from distcourse.examples import models
from distcourse.launch import spawn
from distcourse.parallel.buckets import watch_torch_buckets
from distcourse.parallel.ddp import DDP


def _train(
    watch: bool, width: int, wrap: type = DistributedDataParallel
) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Three steps of torch's DDP (or ours) on wide_mlp, with or without the hook."""
    rank = runtime.require_initialized().rank
    runtime.seed_everything(0, per_rank=False)
    model = models.wide_mlp(width=width, depth=6, d_in=64)
    ddp = wrap(model)
    steps = watch_torch_buckets(ddp) if watch else []
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    runtime.seed_everything(rank)
    x, y = torch.randn(8, 64), torch.randint(0, 10, (8,))
    for _ in range(3):
        optimizer.zero_grad()
        F.cross_entropy(ddp(x), y).backward()
        optimizer.step()
    return steps, [p.detach() for p in model.parameters()]


def _both(width: int, wrap: type = DistributedDataParallel) -> dict[bool, tuple]:
    return {watch: _train(watch, width, wrap) for watch in (True, False)}


def test_torch_ddp_rebuilds_its_buckets_after_the_first_step() -> None:
    for rank, runs in enumerate(spawn(_both, 2, 256)):
        steps, params = runs[True]
        total = 4 * models.count_parameters(models.wide_mlp(256, 6, 64))
        assert total == 1_129_512  # 1.08 MiB: more than torch's first bucket
        assert steps[0] == [total]  # step 1: one bucket in parameter order
        # after the rebuild: first bucket >= 1 MiB (layers 10 ... 2, last first),
        # then what is left (the first layer, 64 x 256 + 256 floats)
        assert steps[1] == steps[2] == [total - 66_560, 66_560]
        assert steps[1][0] >= 2**20
        for got, want in zip(params, runs[False][1], strict=True):
            assert torch.equal(got, want), f"rank {rank}: the hook changed training"


def test_a_model_under_one_mebibyte_keeps_one_bucket() -> None:
    steps, _ = spawn(_train, 2, True, 64)[0]
    total = 4 * models.count_parameters(models.wide_mlp(64, 6, 64))
    assert steps == [[total]] * 3


def test_the_same_hook_watches_our_ddp() -> None:
    """Ours keeps the buckets it made at construction: one, every step, and the
    hook (torch's allreduce_hook inside) trains exactly as our default does."""
    total = 4 * models.count_parameters(models.wide_mlp(256, 6, 64))
    for runs in spawn(_both, 2, 256, DDP):
        steps, params = runs[True]
        assert steps == [[total]] * 3
        for got, want in zip(params, runs[False][1], strict=True):
            assert torch.equal(got, want)
