"""Replicas: checks that every rank holds the same model, and making it so.

Data parallelism (and any replicated dimension of a hybrid) starts from equal
replicas and must keep them equal. These checks are collectives that every rank of
the group calls; all ranks compare the same gathered data, so they all reach the same
verdict and raise together instead of leaving some ranks waiting.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from distcourse.comm.agree import Group

Named = list[tuple[str, nn.Parameter]]  # (name, parameter) pairs, in module order


def differing(named: Named, group: Group = None) -> list[str]:
    """Names of the parameters whose values differ across the ranks of `group`.

    The elementwise min and max over ranks are equal only where all ranks agree, and
    every rank receives the same min and max, so every rank returns the same list.
    """
    if not named:
        return []
    with torch.no_grad():
        flat = torch.cat([p.detach().reshape(-1) for _, p in named])
        low, high = flat.clone(), flat.clone()
        dist.all_reduce(low, op=dist.ReduceOp.MIN, group=group)
        dist.all_reduce(high, op=dist.ReduceOp.MAX, group=group)
    parts = (low != high).split([p.numel() for _, p in named])  # per parameter
    return [name for (name, _), part in zip(named, parts, strict=True) if part.any()]


def same_on_all_ranks(model: nn.Module, group: Group = None) -> bool:
    """True if every rank holds bit-identical parameters (a collective: all call it)."""
    return not differing(list(model.named_parameters()), group)


def check_same_shapes(named: Named, group: Group) -> None:
    """Raise ValueError on every rank unless all ranks wrap the same parameters.

    All ranks gather every rank's (name, shape, dtype) list and compare the same data,
    so they all raise together instead of hanging in mismatched collectives.
    """
    mine = [(name, tuple(p.shape), str(p.dtype)) for name, p in named]
    everyone: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, mine, group=group)
    for rank, theirs in enumerate(everyone):
        if theirs == everyone[0]:
            continue
        if len(theirs) != len(everyone[0]):
            raise ValueError(
                "DDP needs the same model on every rank: rank 0 has "
                f"{len(everyone[0])} parameters, rank {rank} has {len(theirs)}"
            )
        for ours, other in zip(everyone[0], theirs, strict=True):
            if ours != other:
                raise ValueError(
                    "DDP needs the same model on every rank: rank 0 has parameter "
                    f"{ours[0]!r} {ours[1]} {ours[2]}, rank {rank} has {other[0]!r} "
                    f"{other[1]} {other[2]}"
                )


def check_same_values(named: Named, group: Group) -> None:
    """Raise ValueError on every rank if any parameter's value differs across ranks."""
    names = differing(named, group)
    if names:
        raise ValueError(
            f"parameter {names[0]!r} differs across ranks: seed every rank alike "
            "before building the model, or pass check_equal=False to use rank 0's"
        )


def copy_from_rank0(module: nn.Module, group: Group, buffers: bool = True) -> None:
    """Broadcast rank 0's parameters (and buffers), so every replica starts equal."""
    with torch.no_grad():
        extra = module.buffers() if buffers else ()
        for tensor in itertools.chain(module.parameters(), extra):
            dist.broadcast(tensor, group=group, group_src=0)
