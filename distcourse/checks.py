"""Equivalence checks the chapters and tests print: does a run match another?

Verdicts against a stated tolerance, never raw rounding noise: see `verdict`.
Whether replicas agree with each other is `parallel.replicas`' question.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from distcourse import runtime


def flat_parameters(model: nn.Module) -> torch.Tensor:
    """All parameters of `model` as one detached 1-D tensor."""
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def max_difference(a: nn.Module, b: nn.Module) -> float:
    """Largest absolute difference between corresponding parameters of two models."""
    return (flat_parameters(a) - flat_parameters(b)).abs().max().item()


def max_over_ranks(value: float, group: dist.ProcessGroup | None = None) -> float:
    """The largest `value` any rank of `group` (default: the world) holds (a
    collective: every rank of it calls it, and prints the group's verdict)."""
    worst = torch.tensor([float(value)], dtype=torch.float64, device=runtime.device())
    dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=group)
    return worst.item()


def verdict(difference: float, tolerance: float) -> str:
    """A comparison as text that is the same on every machine: '<= 1e-06: PASS'.

    A difference below the tolerance is rounding noise, and its low bits depend on
    the processor (ATen's kernels sum in AVX-512 or AVX2 lanes), the thread count and
    the reduction order: printing it would make the stored output machine-dependent.
    So a PASS shows only the tolerance; a FAIL shows the offending value too.
    """
    if not tolerance > 0:
        raise ValueError(f"tolerance must be positive, got {tolerance}")
    if difference <= tolerance:
        return f"<= {tolerance:.0e}: PASS"
    return f"= {difference:.1e} > {tolerance:.0e}: FAIL"


def outcomes(
    cases: dict[str, Callable[[], object]],
    kinds: tuple[type[BaseException], ...] = (ValueError, TypeError),
    with_type: bool = False,
) -> list[str]:
    """Run each case and say how it ended: 'name: its error message' (with the error's
    type first if `with_type`), or 'name: no error'. For showing, on every rank, that
    bad input is refused with the words a reader needs; an error of another kind
    propagates."""
    got = []
    for name, case in cases.items():
        try:
            case()
            got.append(f"{name}: no error")
        except kinds as err:
            kind = f"{type(err).__name__}: " if with_type else ""
            got.append(f"{name}: {kind}{err}")
    return got
