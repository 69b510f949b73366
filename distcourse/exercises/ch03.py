"""Chapters 3 and 3b's exercises: data parallelism by hand, buckets, bytes, memory.

1. `check_average_gradients(fn)`: after `loss.backward()` on each rank's own batch,
   `fn(model)` leaves every rank with the gradients of one process that saw all
   ranks' batches; 4 ranks.
2. `check_buckets(fn)`: `fn(sizes, cap)` groups parameters (their sizes in bytes, in
   the model's order) into buckets as `parallel.buckets.assign_buckets` does: a list of
   lists of parameter indices.
3. `check_sampler_repeats(x)`: on `cluster.start(3)`, how many of the 1,348 training
   images does `DistributedSampler` hand out twice per epoch?
4. `check_ddp_bytes(x)`: bytes one rank puts on the wire per step of DDP on 4 ranks
   for a model of 2,500,000 float32 parameters.
5. `check_ddp_memory(x)` (3b): bytes one rank holds for a model of 1,000,000 float32
   parameters trained by torch's DDP with Adam (parameters, gradients, buckets,
   optimizer state; `gradient_as_bucket_view=False`, the default).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from distcourse.comm.ledger import ring_wire_bytes
from distcourse.exercises.core import (
    Problem,
    call,
    check_answer,
    check_number,
    check_on_ranks,
    compare,
)
from distcourse.parallel.buckets import assign_buckets

EXERCISES = (
    "average_gradients",
    "buckets",
    "sampler_repeats",
    "ddp_bytes",
    "ddp_memory",
)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))


def _batch(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(8, 4, generator=g), torch.randn(8, 2, generator=g)


def average_gradients_probe(answer: object) -> Problem:
    """On each rank: its batch's gradients, the answer, then one process's."""
    rank, world = dist.get_rank(), dist.get_world_size()
    model, alone = _model(), _model()
    x, y = _batch(rank)
    F.mse_loss(model(x), y).backward()
    call(answer, model)
    xs, ys = zip(*(_batch(r) for r in range(world)), strict=True)
    F.mse_loss(alone(torch.cat(xs)), torch.cat(ys)).backward()
    for (name, p), ref in zip(
        model.named_parameters(), alone.parameters(), strict=True
    ):
        problem = compare(p.grad, ref.grad, f"{name}'s gradient")
        if problem:
            return problem
    return None


def check_average_gradients(answer: object) -> bool:
    """`answer(model)`: gradients averaged over ranks, in place; 4 gloo ranks."""
    return check_on_ranks(
        "ch03.average_gradients",
        answer,
        average_gradients_probe,
        4,
        hint="for every parameter: dist.all_reduce(p.grad), then divide by the world "
        "size (each rank's loss is a mean over its batch, so the ranks' gradients "
        "must be averaged, not summed)",
    )


BUCKET_CASES = (  # (sizes in bytes, cap in bytes)
    ([400, 40, 4000, 40, 400], 500),
    ([64, 64, 64, 64, 64, 64], 128),
    ([1000, 8, 8], 10),
    ([4, 4, 4], 10_000),
)


def _reference(sizes: list[int], cap: int) -> list[list[int]]:
    params = [nn.Parameter(torch.empty(s // 4)) for s in sizes]
    return assign_buckets(params, cap)


def _judge_buckets(answer: object) -> Problem:
    if not callable(answer):
        return f"expected a function, got {type(answer).__name__}"
    for sizes, cap in BUCKET_CASES:
        want = _reference(sizes, cap)
        got = call(answer, list(sizes), cap)
        try:
            same = [list(map(int, b)) for b in got] == want
        except TypeError:
            return f"expected a list of lists of indices, got {got!r:.60}"
        if not same:
            return f"sizes {sizes}, cap {cap}: got {got}, expected {want}"
    return None


def check_buckets(answer: object) -> bool:
    """`answer(sizes, cap) -> [[index, ...], ...]`, checked on four cases."""
    return check_answer(
        "ch03.buckets",
        answer,
        _judge_buckets,
        hint="walk the parameters from the last to the first (backward's order); "
        "a bucket closes as soon as it holds cap bytes or more",
    )


def check_sampler_repeats(answer: object) -> bool:
    """Images DistributedSampler hands out twice, 1,348 images on 3 ranks."""
    n, world = 1348, 3
    return check_number(
        "ch03.sampler_repeats",
        answer,
        world * math.ceil(n / world) - n,
        hint="every rank gets ceil(n / world) samples; the sampler pads the list by "
        "repeating its first samples (drop_last=False)",
    )


def check_ddp_bytes(answer: object) -> bool:
    """Wire bytes per rank per DDP step, 4 ranks, 2,500,000 float32 parameters."""
    return check_number(
        "ch03.ddp_bytes",
        answer,
        ring_wire_bytes("all_reduce", 4 * 2_500_000, 4),
        hint="one ring all-reduce of every gradient: 2(n-1)/n of T, T = 4 bytes "
        "per parameter",
    )


def check_ddp_memory(answer: object) -> bool:
    """Bytes per rank, 1,000,000 float32 parameters, torch DDP with Adam."""
    p = 1_000_000
    return check_number(
        "ch03.ddp_memory",
        answer,
        (4 + 4 + 4 + 8) * p,
        hint="4 bytes each for the parameter, its gradient and its copy in a bucket, "
        "and 8 for Adam's two moments",
    )
