"""Ulysses attention: trade the sequence split for a head split, attend, trade back.

Ring attention keeps the sequence split and moves keys and values round. DeepSpeed
Ulysses (Jacobs et al. 2023, arXiv:2309.14509) moves the split instead: attention
heads are independent, so one all_to_all turns "my T/cp tokens of every head" into
"every token of my H/cp heads", each rank runs ordinary attention on the whole
sequence of its heads, and a second all_to_all turns the output back::

    q, k, v  (B, H, T/cp, D)  --all_to_all-->  (B, H/cp, T, D)   heads r·H/cp ...
    out      (B, H/cp, T, D)  --all_to_all-->  (B, H, T/cp, D)

q, k and v travel in one all_to_all: each is cut into cp groups of heads (group j
for rank j), and the three groups for one rank are stacked into one piece. What
arrives is in rank order, two chunks of each rank's `layout`; the chunks are put
back in sequence order before the attention (so its causal mask is the plain
lower triangle) and in rank order after. The backward is the same two all_to_alls
in reverse (`comm.autograd.all_to_all_along`); the attention's own backward is
PyTorch's.

Limits: cp must divide q's heads and k's (under grouped-query attention, the Hkv
heads: head group j of q reads head group j of K/V only when cp divides Hkv). A
model with 8 K/V heads (Llama 3 70B) stops at cp = 8; ring attention does not.
Bytes per rank per call (`cost.ulysses_bytes`): the four all_to_alls move
(cp − 1)/cp of q, k, v, out and their gradients: 4(X_q + X_kv)(cp − 1)/cp, flat in
cp, where ring attention's grows with cp.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from distcourse.comm.agree import Group, agree, members
from distcourse.comm.autograd import all_to_all_along
from distcourse.parallel.context.ring import check_inputs
from distcourse.parallel.context.split import chunk_ids


def check_heads(heads: int, kv_heads: int, cp: int) -> None:
    """ValueError unless cp divides q's heads and k's: each rank attends with whole
    head groups, and head group j of q reads head group j of K/V."""
    for what, n in (("q", heads), ("k and v", kv_heads)):
        if n % cp:
            raise ValueError(
                f"ulysses_attention: {what} have {n} heads, which do not split "
                f"over cp={cp} ranks; Ulysses needs cp to divide every head count "
                "(ring attention does not)"
            )


def head_groups(x: Tensor, cp: int) -> Tensor:
    """(B, H, L, D) -> (B, cp, H/cp, L, D): head group j, for rank j."""
    return x.unflatten(1, (cp, x.size(1) // cp))


def scatter_heads(parts: list[Tensor], cp: int, group: Group) -> Tensor:
    """q, k, v (B, heads, L, D) -> my head groups of each, every token, stacked
    along dim 1, in one all_to_all (one message per peer, not three)."""
    packed = torch.cat([head_groups(t, cp) for t in parts], 2)  # (B, cp, ., L, D)
    return all_to_all_along(packed, 1, 3, group, check=False).squeeze(1)


def _order(cp: int, layout: str) -> list[int]:
    """The chunks of the sequence in the order the all_to_all delivers them."""
    return [i for r in range(cp) for i in chunk_ids(cp, r, layout)]


def _to_sequence(x: Tensor, order: list[int]) -> Tensor:
    """Chunks along dim 2 delivered in `order` -> in sequence order."""
    chunks, where = x.chunk(len(order), 2), {i: n for n, i in enumerate(order)}
    return torch.cat([chunks[where[i]] for i in range(len(order))], 2)


def _to_ranks(x: Tensor, order: list[int]) -> Tensor:
    """Chunks along dim 2 in sequence order -> in `order`, for the way back."""
    chunks = x.chunk(len(order), 2)
    return torch.cat([chunks[i] for i in order], 2)


def ulysses_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    group: Group = None,
    *,
    causal: bool = True,
    layout: str = "zigzag",
    scale: float | None = None,
    check: bool = True,
) -> Tensor:
    """This rank's rows of `F.scaled_dot_product_attention` of the whole sequence
    (is_causal=causal, enable_gqa=True), by two all_to_alls (module docstring).

    q (B, H, L, D), k and v (B, Hkv, L, D): this rank's tokens in `layout`'s order,
    as for `ring_attention`. ValueError before any message unless cp divides H and
    Hkv; `check` (the same on every rank) adds one all_gather of 112 bytes so ranks
    whose shapes differ raise the same ValueError instead of hanging.
    """
    g = members(group, "ulysses_attention")
    cp = g.size
    hkv = check_inputs(q, k, v, cp, layout, "ulysses_attention")
    check_heads(q.size(1), hkv, cp)
    agree(
        "ulysses_attention",
        q,
        group,
        validate=lambda: hkv,
        key_name="kv heads",
        check=check,
    )
    heads, order = [q.size(1) // cp, hkv // cp, hkv // cp], _order(cp, layout)
    mine = scatter_heads([q, k, v], cp, group)  # (B, (H + 2Hkv)/cp, T, D)
    q_, k_, v_ = _to_sequence(mine, order).split(heads, 1)
    scale = 1 / math.sqrt(q.size(-1)) if scale is None else scale
    out = F.scaled_dot_product_attention(
        q_, k_, v_, is_causal=causal, scale=scale, enable_gqa=hkv != q.size(1)
    )  # (B, H/cp, T, D): my heads, every token
    out = _to_ranks(out, order).unsqueeze(1)  # (B, 1, H/cp, T, D)
    return all_to_all_along(out, 3, 1, group, check=False).flatten(1, 2)
