"""Moving a global tensor to another placement (other ranks), with a backward.

`x.to_global(placement=q, sbp=...)` with q other than x's placement p. As in
OneFlow, every rank of both placements calls it, and a rank outside a placement
holds its tensors too: a GlobalTensor with the logical shape, placement and SBP and
an empty local piece (`absent(...)` makes one; its to_local() is empty, as
OneFlow's is). The move, in two stages:

    1. on p: box x to broadcast on every mesh dimension (the collectives of boxing;
       none if x is already broadcast), so every rank of p holds the whole tensor;
    2. every rank of q takes its piece under the new signature: a rank also in p
       cuts it from its own copy (no message); the others, in q's order, are served
       by the ranks of p in turn (p2p.send_tensor / recv_tensor, with the shape
       handshake, so a mismatch raises on both sides instead of hanging).

Simple, not optimal: a split is gathered on p before it is cut for q. The backward
is the same move from q back to p, into the gradient signature (P read as B).
Everything is checked before the first message.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from distcourse.comm.p2p import HEADER_LEN, recv_tensor, send_tensor
from distcourse.global_tensor import tensor
from distcourse.global_tensor.boxing import box, steps, transfer_bytes
from distcourse.global_tensor.placement import Placement
from distcourse.global_tensor.sbp import (
    Broadcast,
    Signature,
    describe,
    local_piece,
    local_shape,
    numel,
    signature,
)
from distcourse.global_tensor.tensor import GlobalTensor, default_grad_sbp

HEADER_BYTES = HEADER_LEN * 8  # one int64 header (sender) or ack (receiver)


def absent(
    shape: tuple[int, ...],
    placement: Placement,
    sbp: Any,
    dtype: torch.dtype = torch.float32,
    requires_grad: bool = False,
) -> GlobalTensor:
    """What a rank outside `placement` holds of a tensor there: the logical shape,
    placement and signature, and an empty local piece."""
    shape = tuple(shape)
    sig = signature(sbp, placement.ndim, len(shape), "absent")
    local = torch.empty(0, dtype=dtype, device=placement.device)
    return GlobalTensor(local, placement, sig, shape, requires_grad=requires_grad)


def _flat(pl: Placement) -> list[int]:
    return pl.grid.flatten().tolist()


def _coord(pl: Placement, rank: int) -> tuple[int, ...]:
    return tuple((pl.grid == rank).nonzero()[0].tolist())


def servers(p: Placement, q: Placement) -> dict[int, int]:
    """Which rank of p sends each rank of q that is not in p its piece: the ranks of
    p in turn, in q's (row-major) order."""
    src, need = _flat(p), [r for r in _flat(q) if r not in _flat(p)]
    return {r: src[k % len(src)] for k, r in enumerate(need)}


def check(x: Any, q: Any, what: str = "to_global") -> None:
    """ValueError/TypeError naming what is wrong, before any message."""
    if not isinstance(x, GlobalTensor):
        raise TypeError(f"{what}: expected a GlobalTensor, got {type(x).__name__}")
    if not isinstance(q, Placement):
        raise TypeError(
            f"{what}: placement must be a Placement, got {type(q).__name__}"
        )
    p = x.placement
    if p.device_type != q.device_type:
        raise ValueError(
            f"{what}: cannot move from {p} to {q}: device types differ "
            f"({p.device_type!r} vs {q.device_type!r})"
        )
    me = dist.get_rank()
    if me not in _flat(p) and me not in _flat(q):
        raise ValueError(
            f"{what}: rank {me} is in neither {p} nor {q}; only the ranks of "
            "the two placements take part in a move"
        )
    want = (
        (0,)
        if me not in _flat(p)
        else tuple(local_shape(tuple(x.shape), x.sbp, p.hierarchy, p.coord))
    )
    if tuple(x.local_tensor.shape) != want:
        raise ValueError(
            f"{what}: rank {me}'s local piece has shape {list(x.local_tensor.shape)}, "
            f"expected {list(want)} for {describe(x.sbp)} of {list(x.shape)} on {p}"
        )


def move(x: GlobalTensor, q: Placement, sig: Signature) -> GlobalTensor:
    """x on placement q under `sig`, outside autograd (see the module docstring)."""
    p, shape, me = x.placement, tuple(x.shape), dist.get_rank()
    full = None
    if p.coord is not None:  # stage 1: the whole tensor on every rank of p
        whole = tuple(Broadcast() for _ in x.sbp)
        full = box(x.local_tensor, p, x.sbp, whole, shape)
    for r, sender in servers(p, q).items():  # stage 2: the ranks of q not in p
        if me == sender:
            piece = local_piece(full, sig, q.hierarchy, _coord(q, r))
            send_tensor(piece, r)
    if q.coord is None:
        local = torch.empty(0, dtype=x.dtype, device=q.device)
    elif full is not None:
        local = local_piece(full, sig, q.hierarchy, q.coord)
    else:
        mine = local_shape(shape, sig, q.hierarchy, q.coord)
        local = recv_tensor(servers(p, q)[me], expect=(mine, x.dtype))
    return GlobalTensor(local, q, sig, shape)


def move_bytes(
    shape: tuple[int, ...],
    item: int,
    p: Placement,
    src: Signature,
    q: Placement,
    dst: Signature,
    rank: int,
) -> int:
    """Bytes `rank` sends in a move, as the Ledger counts them: its boxing to
    broadcast on p (boxing.transfer_bytes per step), a header plus the piece for each
    rank of q it serves (no data message for an empty piece), and one ack if it
    receives."""
    total = 0
    if rank in _flat(p):
        c = _coord(p, rank)
        whole = tuple(Broadcast() for _ in src)
        for k, before, after in steps(src, whole):
            held = before[:k] + (Broadcast(),) + before[k + 1 :]
            size = local_shape(shape, held, p.hierarchy, c)
            total += transfer_bytes(before[k], after[k], size, p.hierarchy[k], item)
    for r, sender in servers(p, q).items():
        if sender == rank:
            total += HEADER_BYTES
            total += numel(local_shape(shape, dst, q.hierarchy, _coord(q, r))) * item
    if rank in servers(p, q):
        total += HEADER_BYTES
    return total


class Move(torch.autograd.Function):
    """A move with a backward: the gradient moves back to x's placement, into the
    signature `grad`."""

    @staticmethod
    def forward(
        ctx: Any, x: GlobalTensor, q: Placement, sig: Signature, grad: Signature
    ) -> Any:
        ctx.p, ctx.grad = x.placement, grad
        return move(x, q, sig)

    @staticmethod
    def backward(ctx: Any, grad: Any) -> tuple:
        if not isinstance(grad, GlobalTensor):
            raise TypeError(
                f"to_global backward: expected a global gradient, got "
                f"{type(grad).__name__}"
            )
        return move(grad, ctx.p, ctx.grad), None, None, None


def to_placement(
    x: GlobalTensor, q: Placement, sbp: Any = None, grad_sbp: Any = None
) -> GlobalTensor:
    """x.to_global(placement=q, sbp=...) for q other than x.placement: checked, then
    moved with a backward. sbp=None keeps x's signature (same mesh dimensions)."""
    what = "to_global"
    check(x, q, what)
    p = x.placement
    if sbp is None and q.ndim != p.ndim:
        raise ValueError(
            f"{what}: give sbp= to move from a {p.ndim}-D to a {q.ndim}-D placement"
        )
    sig = x.sbp if sbp is None else signature(sbp, q.ndim, x.dim(), what)
    grad = (
        default_grad_sbp(x.sbp)
        if grad_sbp is None
        else signature(grad_sbp, p.ndim, x.dim(), "grad_sbp")
    )
    return Move.apply(x, q, sig, grad)


tensor.mover = to_placement  # x.to_global(placement=other) calls it
