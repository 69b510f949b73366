"""Faults planted in global-tensor boxing (`global_tensor.boxing.convert`), shared
by chapters 6, 7 and 8b's negative controls. Each wraps the real `convert(x, pl, dim,
src, dst, size)` (a harness `Plant(boxing, "convert", fault, wrap=True)`), as a bug
in it would behave.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from distcourse.global_tensor.sbp import Split, broadcast, partial_sum, split

S0, S1, B, P = split(0), split(1), broadcast, partial_sum
ROUTES = {  # (src, dst): a roundabout route's signatures, each costing more
    (S0, B): [P, B],  # place in zeros, then all_reduce
    (P, S0): [B, S0],  # all_reduce, then slice
    (P, B): [B, S0, B],  # all_reduce, slice, all_gather again
    (S0, S1): [B, S1],  # all_gather, then slice
    (B, S0): [P, S0],  # zeros, then reduce_scatter
    (B, P): [S0, B, P],  # slice, all_gather, zeros
    (S0, P): [B, P],  # all_gather, then zeros
}


def sums_twice(convert: Callable) -> Callable:
    """A partial tensor summed twice: every P -> B or P -> S doubled (the classic
    gradient x 2)."""

    def faulty(x: Tensor, pl, dim, src, dst, size) -> Tensor:  # noqa: ANN001
        out = convert(x, pl, dim, src, dst, size)
        return out * 2 if src == P and dst != P else out

    return faulty


def wrong_order(convert: Callable) -> Callable:
    """The pieces put in the wrong order: each split flipped along its dim."""

    def faulty(x: Tensor, pl, dim, src, dst, size) -> Tensor:  # noqa: ANN001
        out = convert(x, pl, dim, src, dst, size)
        along = dst if isinstance(dst, Split) else src
        if isinstance(along, Split) and src != dst:
            return torch.flip(out, [along.dim])
        return out

    return faulty


def roundabout(convert: Callable) -> Callable:
    """Each conversion by another route (ROUTES), one step after another: the same
    values, more bytes (1-D placements: the planner's rules for 2-D are bypassed)."""

    def faulty(x: Tensor, pl, dim, src, dst, size) -> Tensor:  # noqa: ANN001
        for step in ROUTES.get((src, dst), [dst]):
            x, src = convert(x, pl, dim, src, step, size), step
        return x

    return faulty


def gathered_twice(convert: Callable) -> Callable:
    """A split tensor gathered twice, the second kept: the same numbers, more
    bytes."""

    def faulty(x: Tensor, pl, dim, src, dst, size) -> Tensor:  # noqa: ANN001
        if isinstance(src, Split) and dst == B:
            convert(x, pl, dim, src, dst, size)
        return convert(x, pl, dim, src, dst, size)

    return faulty


class NoBroadcast:
    """torch.distributed as a module sees it, but `broadcast` does nothing."""

    def __getattr__(self, name: str) -> Any:
        return getattr(dist, name)

    @staticmethod
    def broadcast(*_: object, **__: object) -> None:
        return None
