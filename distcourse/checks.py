"""Equivalence checks the chapters print: do ranks agree, does a run match another."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


def flat_parameters(model: nn.Module) -> torch.Tensor:
    """All parameters of `model` as one detached 1-D tensor."""
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def same_on_all_ranks(model: nn.Module) -> bool:
    """True if every rank holds bit-identical parameters (a collective: all call it)."""
    mine = flat_parameters(model)
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, mine)
    return all(torch.equal(mine, other) for other in everyone)


def max_difference(a: nn.Module, b: nn.Module) -> float:
    """Largest absolute difference between corresponding parameters of two models."""
    return (flat_parameters(a) - flat_parameters(b)).abs().max().item()
