"""Tokens to their experts and back: two all_to_alls whose counts differ by rank.

A rank sorts its kept assignments by expert, so the rows for the experts of rank
q form one block, and sends block q to rank q (dispatch); each rank runs its own
experts on what arrived and sends every row back where it came from (combine).
The counts are uneven (a router sends more to a popular expert), so they travel
first: one all_to_all of E int64 per rank, after which every rank knows how many
rows it receives from each peer, for each of its experts.

`dist.all_to_all_single` with split sizes runs on gloo (torch 2.11 and later); its
backward is the same exchange with the counts swapped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

Group = dist.ProcessGroup | None


class _AllToAllRows(torch.autograd.Function):
    """Rows (N, C): send[q] rows to rank q, recv[s] rows from rank s."""

    @staticmethod
    def forward(
        ctx: Any, x: Tensor, send: list[int], recv: list[int], group: Group
    ) -> Tensor:
        ctx.send, ctx.recv, ctx.group = send, recv, group
        out = x.new_empty((sum(recv), *x.shape[1:]))  # (sum(recv), C)
        dist.all_to_all_single(out, x.contiguous(), recv, send, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple:
        back = grad.new_empty((sum(ctx.send), *grad.shape[1:]))  # (sum(send), C)
        dist.all_to_all_single(
            back, grad.contiguous(), ctx.send, ctx.recv, group=ctx.group
        )
        return back, None, None, None


def all_to_all_rows(
    x: Tensor, send: list[int], recv: list[int], group: Group
) -> Tensor:
    """All_to_all of the rows of x with uneven counts, differentiable."""
    return _AllToAllRows.apply(x, send, recv, group)


def exchange_counts(per_expert: Tensor, group: Group) -> Tensor:
    """(E,) rows this rank sends to each expert -> (n, E / n) rows each rank sends
    to each of this rank's experts. One all_to_all of E int64."""
    n = dist.get_world_size(group)
    arrived = torch.empty_like(per_expert)
    dist.all_to_all_single(arrived, per_expert.contiguous(), group=group)
    return arrived.view(n, -1)


def apply_experts(rows: Tensor, ids: Tensor, experts: nn.ModuleList) -> Tensor:
    """Expert ids[i] (local index) applied to rows[i]; one batch per expert."""
    order = torch.argsort(ids, stable=True)
    counts = torch.bincount(ids, minlength=len(experts)).tolist()
    pieces = rows[order].split(counts)  # an empty piece for an idle expert
    out = torch.cat([e(p) for e, p in zip(experts, pieces, strict=True)])
    return out[torch.argsort(order)]  # back in arrival order


@dataclass(frozen=True)
class Traffic:
    """Rows one MoE layer's forward exchanged on this rank: sent[q] rows to rank q
    and received[s] from rank s (own rank included); row_bytes per row; `counts`
    the int64 per expert sent first."""

    sent: tuple[int, ...]
    received: tuple[int, ...]
    rank: int
    row_bytes: int
    counts: int


RowsA2A = Callable[[Tensor, list[int], list[int], Group], Tensor]


def to_experts(
    rows: Tensor,
    expert: Tensor,
    experts: nn.ModuleList,
    first: int,
    group: Group,
    a2a: RowsA2A = all_to_all_rows,
) -> tuple[Tensor, Traffic | None]:
    """Rows sorted by global expert index -> each row's expert output, in the same
    order. Without a group (or a group of one), every expert is local. `a2a`
    moves the rows (`all_to_all_rows`; a test plants a fault in another)."""
    if group is None or dist.get_world_size(group) == 1:
        return apply_experts(rows, expert - first, experts), None
    n, local = dist.get_world_size(group), len(experts)
    per_expert = torch.bincount(expert, minlength=n * local)  # (E,)
    incoming = exchange_counts(per_expert, group)  # (n, E/n)
    # .tolist() waits for the device (a host sync): all_to_all_single takes its
    # split sizes as Python ints, and the output's size must be known to allocate
    send = per_expert.view(n, local).sum(dim=1).tolist()
    recv = incoming.sum(dim=1).tolist()
    arrived = a2a(rows, send, recv, group)  # (sum(recv), C)
    ids = torch.arange(local, device=rows.device).repeat(n)
    ids = torch.repeat_interleave(ids, incoming.reshape(-1))
    out = apply_experts(arrived, ids, experts)
    back = a2a(out, recv, send, group)  # (sum(send), C)
    row_bytes = rows.shape[1] * rows.element_size()
    rank = dist.get_rank(group)
    traffic = Traffic(tuple(send), tuple(recv), rank, row_bytes, n * local)
    return back, traffic
