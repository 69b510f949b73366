"""Chapter 1's exercises: ranks, one collective, DDP's two promises.

1. `check_average(fn)`: `fn(tensor)` returns the mean over all ranks of `tensor`
   (every rank gets it), with one collective; 4 ranks.
2. `check_same_start(fn)`: `fn(model)` makes every rank's parameters equal to rank 0's
   (each rank built its model from a different seed); 4 ranks.
3. `check_steps_per_epoch(x)`: with `cluster.start(2)`, how many steps per epoch does
   each rank take over the digits' 1,348 training images, batches of 32?
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn

from distcourse.exercises.core import (
    Problem,
    call,
    check_number,
    check_on_ranks,
    compare,
)

EXERCISES = ("average", "same_start", "steps_per_epoch")
DIGITS_TRAIN = 1348  # datasets.digits(train=True)


def average_probe(answer: object) -> Problem:
    """On each rank: the answer's mean of rank-dependent values against the mean."""
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = torch.arange(6.0) * (rank + 1)
    want = torch.arange(6.0) * (world + 1) / 2
    out = call(answer, mine.clone())
    return compare(out, want, "the mean")


def check_average(answer: object) -> bool:
    """`answer(tensor) -> mean over ranks`, run on 4 gloo ranks."""
    return check_on_ranks(
        "ch01.average",
        answer,
        average_probe,
        4,
        hint="dist.all_reduce sums in place on every rank; divide by "
        "dist.get_world_size() and return the tensor",
    )


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))


def same_start_probe(answer: object) -> Problem:
    """On each rank: a model from seed `rank`; after the answer, rank 0's weights."""
    model, want = _model(dist.get_rank()), _model(0)
    call(answer, model)
    for (name, got), ref in zip(
        model.named_parameters(), want.parameters(), strict=True
    ):
        problem = compare(got, ref, f"parameter {name}", atol=0)
        if problem:
            return problem
    return None


def check_same_start(answer: object) -> bool:
    """`answer(model)`: every rank's parameters become rank 0's; 4 gloo ranks."""
    return check_on_ranks(
        "ch01.same_start",
        answer,
        same_start_probe,
        4,
        hint="what DDP does when it wraps a model: dist.broadcast(p.data, src=0) for "
        "every parameter, on every rank, in the same order",
    )


def check_steps_per_epoch(answer: object) -> bool:
    """Steps per epoch on each of 2 ranks, 1,348 images, batches of 32: a number."""
    return check_number(
        "ch01.steps_per_epoch",
        answer,
        math.ceil(math.ceil(DIGITS_TRAIN / 2) / 32),
        hint="DistributedSampler gives each of the 2 ranks half of the images; the "
        "DataLoader keeps the last, shorter batch (drop_last=False)",
    )
