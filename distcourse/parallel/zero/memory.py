"""Bytes a rank holds for the model state, by kind, and the ZeRO formulas for them.

`held(parameters, optimizer)` counts what is there after a step: the parameters this
rank stores, their gradients (None counts nothing) and the optimizer's state tensors.
`formula(stage, ...)` says what it must be for fp32 AdamW, exactly, per rank: the
paper's DP 16Ψ, ZeRO-1 4Ψ + 4Ψ + 8Ψ/N, ZeRO-2 4Ψ + 12Ψ/N, ZeRO-3 16Ψ/N, where Ψ/N is
this rank's share (whole parameters under ZeRO-1/2, dim-0 pieces under ZeRO-3) and
AdamW adds a 4-byte step counter per parameter tensor it steps.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch
from torch.optim import Optimizer

FP32 = 4  # bytes per element
ADAMW_STATE = 2 * FP32  # exp_avg and exp_avg_sq per element
STEP = 4  # AdamW's step counter: a float32 scalar per parameter tensor
KINDS = ("parameters", "gradients", "optimizer")


def held(parameters: Iterable[torch.Tensor], optimizer: Optimizer) -> dict[str, int]:
    """Bytes this rank holds now, by kind (the optimizer's `.optim` if it has one)."""
    params = list(parameters)
    inner = getattr(optimizer, "optim", optimizer)  # ZeRO's local optimizer
    state = [t for s in inner.state.values() for t in s.values() if torch.is_tensor(t)]
    return dict(
        parameters=sum(_bytes(p) for p in params),
        gradients=sum(_bytes(p.grad) for p in params if p.grad is not None),
        optimizer=sum(_bytes(t) for t in state),
    )


def formula(stage: int, total: int, share: int, tensors: int) -> dict[str, int]:
    """fp32 AdamW bytes per rank at ZeRO `stage` (0 is plain DP).

    `total`: elements of the whole model (Ψ); `share`: elements this rank owns;
    `tensors`: parameter tensors this rank steps (each has a step counter).
    """
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3, got {stage}")
    return dict(
        parameters=FP32 * (share if stage == 3 else total),
        gradients=FP32 * (share if stage >= 2 else total),
        optimizer=ADAMW_STATE * (total if stage == 0 else share) + STEP * tensors,
    )


def expected_share(
    shapes: Sequence[Sequence[int]], world: int, rank: int, stage: int
) -> tuple[int, int]:
    """(numbers, tensors) that `rank` of `world` steps at ZeRO `stage`, from the
    parameters' shapes alone, for `formula`'s share: written apart from the code that
    shards, so that a sharding that keeps too much cannot pass by measuring itself.

    DP steps everything. ZeRO-1/2 (torch's rule): whole tensors, largest first, each
    to the rank holding the fewest numbers so far (the lowest rank on a tie). ZeRO-3:
    every tensor cut along dim 0 as `torch.chunk` cuts it (ceil(rows / world) rows a
    piece, the last ones short or empty), each rank stepping a piece of every tensor.
    """
    sizes = [math.prod(s) for s in shapes]
    if stage == 0:
        return sum(sizes), len(sizes)
    if stage == 3:
        share = 0
        for shape in shapes:
            rows, width = (shape[0], math.prod(shape[1:])) if shape else (1, 1)
            piece = -(-rows // world)  # torch.chunk's rows per piece
            share += max(0, min(piece, rows - rank * piece)) * width
        return share, len(sizes)
    owned: list[list[int]] = [[] for _ in range(world)]
    for size in sorted(sizes, reverse=True):
        min(owned, key=sum).append(size)
    return sum(owned[rank]), len(owned[rank])


def _bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def step_bytes(
    stage: int, numel: list[int], width: int, rank: int, element_size: int = FP32
) -> int:
    """Wire bytes rank `rank` sends in one step (the book's ring convention).

    `numel[r]`: elements rank r owns; `width`: the longest share (reduce-scatter
    pads every share to it). DP all-reduces all Ψ elements: 2(N-1)/N x Ψ. ZeRO-1
    adds the shards' broadcasts, each rank the root of its own, run as a chain from
    the root: every rank forwards every shard but the one whose chain ends at it
    (the next rank's), Ψ - numel[rank + 1]; (N-1)/N x Ψ on average. ZeRO-2
    reduce-scatters the gradients instead of all-reducing them, (N-1) x width, so
    a step moves about what DP's all-reduce does, the padding aside.
    """
    world, total = len(numel), sum(numel)
    all_reduce = 2 * (world - 1) * total * element_size // world
    shards = (total - numel[(rank + 1) % world]) * element_size if world > 1 else 0
    reduce_scatter = (world - 1) * width * element_size
    return {0: all_reduce, 1: all_reduce + shards, 2: reduce_scatter + shards}[stage]
