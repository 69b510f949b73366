"""Comparisons a lab makes after every rank finished: with one process, across ranks.

Each returns sentences that name the ranks which differ (empty when all agree), and
never prints a raw difference: a verdict is against a tolerance (checks.verdict's
rule), so the text is the same on every machine.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from distcourse.labs.report import ranks_text

TOLERANCE = 1e-5


def close(a: Tensor, b: Tensor, tolerance: float = TOLERANCE) -> bool:
    """Same shape and every element within `tolerance`."""
    if a.shape != b.shape:
        return False
    return (
        bool((a.double() - b.double()).abs().max() <= tolerance) if a.numel() else True
    )


def against_one(
    name: str,
    got: Sequence[Tensor],
    want: Sequence[Tensor],
    tolerance: float = TOLERANCE,
) -> list[str]:
    """`got[r]` is rank r's `name`; `want[r]` what one process computes for it."""
    bad = [
        r
        for r, (g, w) in enumerate(zip(got, want, strict=True))
        if not close(g, w, tolerance)
    ]
    if not bad:
        return []
    shapes = [r for r in bad if got[r].shape != want[r].shape]
    if shapes:
        r = shapes[0]
        return [
            f"'{name}' on {ranks_text(shapes)} has shape {list(got[r].shape)}, "
            f"one process's has {list(want[r].shape)}"
        ]
    verb = "differs" if len(bad) == 1 else "differ"
    return [
        f"'{name}' on {ranks_text(bad)} {verb} from one process (> {tolerance:.0e})"
    ]


def replicated(
    name: str, got: Sequence[Tensor], tolerance: float = TOLERANCE
) -> list[str]:
    """Ranks whose `name` differs from rank 0's, for a tensor every rank should hold
    the same (a replicated parameter, an activation after an all-reduce)."""
    bad = [r for r, g in enumerate(got) if not close(g, got[0], tolerance)]
    if not bad:
        return []
    return [
        f"'{name}' should be the same on every rank, but {ranks_text(bad)} "
        f"{'differs' if len(bad) == 1 else 'differ'} from rank 0"
    ]


def same_everywhere(want: Tensor, world: int) -> list[Tensor]:
    """One process's value, as every rank should hold it."""
    return [want] * world


def as_tensors(values: Sequence[float]) -> Tensor:
    """A list of numbers as a float64 tensor (logged losses, for example)."""
    return torch.tensor(list(values), dtype=torch.float64)
