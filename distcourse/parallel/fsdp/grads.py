"""Sharded gradients: `clip_grad_norm_(model, max_norm)` over them, and
`gradient_gap`, how far they are from torch's or one process's.

Each rank holds only its pieces' gradients, so no rank can take the norm alone. The
2-norm of the whole gradient is the square root of the sum of squares of every
piece, and the pieces of a shard group cover each parameter once (the padding never
reaches a piece's `.grad`): sum the squares here, all-reduce the sum over the shard
group (not over HSDP's replicas, which hold the same pieces), take the root. Every
rank then scales its pieces by the same `max_norm / (norm + 1e-6)` when that is
below 1, as `torch.nn.utils.clip_grad_norm_` does in one process (and on torch's
FSDP2, whose gradients are Shard(0) DTensors: the same all-reduce, done by DTensor).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor, nn

from distcourse.parallel.fsdp.api import local_pieces, units


def clip_grad_norm_(
    model: nn.Module, max_norm: float, norm_type: float = 2.0
) -> Tensor:
    """Scale `model`'s sharded gradients so their global 2-norm is at most
    `max_norm`; return that norm before clipping (the same on every rank).

    A collective over the units' shard group: every rank calls it. ValueError,
    before it sends, for a norm other than 2, a `max_norm` not positive, a model
    without units, or units sharded over different groups.
    """
    if norm_type != 2.0:
        raise ValueError(f"clip_grad_norm_: only the 2-norm here, got {norm_type}")
    if not max_norm > 0:
        raise ValueError(f"clip_grad_norm_: max_norm must be positive, got {max_norm}")
    sharded = units(model)
    if not sharded:
        raise ValueError("clip_grad_norm_: the model has no fully_shard units")
    if len({id(u.group) for u in sharded}) > 1:
        raise ValueError("clip_grad_norm_: the units are sharded over other groups")
    pieces = {id(p) for u in sharded for p in u.sharded}
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    mine = [g for p, g in _with_grads(model) if id(p) in pieces]
    whole = [g for p, g in _with_grads(model) if id(p) not in pieces]
    device = sharded[0].device
    squares = torch.zeros((), dtype=torch.float32, device=device)
    for g in mine:
        squares += g.detach().float().pow(2).sum()
    dist.all_reduce(squares, group=sharded[0].group)
    for g in whole:  # not sharded: the same on every rank, counted once
        squares += g.detach().float().pow(2).sum()
    norm = squares.sqrt()
    scale = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for g in grads:
        g.detach().mul_(scale.to(g.dtype))
    return norm


def _with_grads(model: nn.Module) -> list[tuple[nn.Parameter, Tensor]]:
    """(parameter, gradient) for each parameter of `model` that has one."""
    return [(p, p.grad) for p in model.parameters() if p.grad is not None]


def gradient_gap(model: nn.Module, reference: nn.Module | dict[str, Tensor]) -> float:
    """Largest |this rank's gradient pieces - the reference's| (0.0 if all empty).

    `reference`: torch's FSDP2 model of the same structure (its gradients are
    Shard(0) DTensors, compared by their local pieces, the same torch.chunk rows as
    ours), or one process's full gradients by parameter name (cut as `model`'s
    pieces are, `api.local_pieces`). No collective: take the max over ranks after.
    """
    got = [p.grad for p in model.parameters()]
    if isinstance(reference, dict):
        want = list(local_pieces(model, reference).values())
    else:
        want = [p.grad.to_local() for p in reference.parameters()]
    if any(g is None for g in got) or len(want) != len(got):
        raise ValueError("gradient_gap: every parameter needs a gradient, on both")
    flat = [(a - b).flatten() for a, b in zip(got, want, strict=True)]
    diff = torch.cat(flat).abs()
    return diff.max().item() if diff.numel() else 0.0
