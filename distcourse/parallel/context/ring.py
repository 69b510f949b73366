"""Ring attention: softmax(q kᵀ / √d) v over a sequence split across a `cp` group.

Each rank holds its tokens' queries, keys and values (`split`: two chunks of
c = T / (2·cp) tokens). Queries never move. Keys and values go round the ring:
at step s a rank holds the K/V chunks of rank r − s, computes the blocks of scores
its queries have with them, and passes them on to rank r + 1; after cp − 1 passes
every query has met every key.

**Forward: online softmax.** A query row cannot normalise its scores before it has
seen all of them, and the others arrive later. So each row keeps a running max m,
a running sum l of exp(score − m) and an unnormalised output acc; a new block of
scores S with values V updates them (flash attention's recurrence)::

    m' = max(m, rowmax S)      l' = l·e^(m − m') + Σ e^(S − m')
    acc' = acc·e^(m − m') + e^(S − m') V

and at the end out = acc / l, and the log-sum-exp lse = m + log l is kept for the
backward. Under a causal mask a block whose keys all come after its queries is
skipped (not computed, not counted in `Work`), and the block of a chunk with itself
is masked on its upper triangle; every row then sees at least its own key, so m
is finite wherever it is used.

**Backward: K/V go round again, their gradients travel with them.** With lse saved,
a block's probabilities are P = e^(S − lse), exactly the forward's, without the
other blocks; with D = rowsum(dout ∘ out) (flash attention 2)::

    dV_b += Pᵀ dout        dS = P ∘ (dout V_bᵀ − D)
    dQ += dS K_b / √d      dK_b += dSᵀ Q / √d

dQ stays on the rank. dK_b and dV_b belong to the rank that owns chunk b, so each
rank sends, with the K/V it received, the dK/dV it has added to them so far: one
message of four tensors per step. After the last step the sums sit one rank before
their owner, and one last pass of dK/dV hands them home. Backward thus sends K, V
cp − 1 times and dK, dV cp times.

**Grouped-query attention (GQA, MQA).** K and V may have fewer heads than q, Hkv
dividing H: q's head h reads K/V head h // (H / Hkv), as `F.scaled_dot_product_attention
(..., enable_gqa=True)` does. Only the Hkv heads travel (H / Hkv times fewer bytes);
each block repeats them for its queries, and the backward sums a K/V head's gradient
over the q heads that read it before it travels.

Messages are `comm.p2p.send_recv` (send right, receive left, posted together, so the
ring cannot deadlock), whose handshake refuses a mismatched shape; the ledger sees
every byte (`cost.ring_bytes`). The compute of a step does not overlap its message
here: production kernels post the next pass before computing this one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from distcourse.comm import p2p
from distcourse.comm.agree import Group, Members, agree, members
from distcourse.parallel.context.split import check_layout, check_sequence, chunk_ids

SKIP = "skip"  # a block whose keys all follow its queries: nothing to compute
Stats = tuple[Tensor, Tensor, Tensor]  # a row's running max m, sum l, output acc


@dataclass
class Work:
    """What this rank's forward computed: blocks of c x c scores, and the score
    entries a causal mask left in them (exact counts, added by every call)."""

    blocks: int = 0
    scores: int = 0


@dataclass(frozen=True)
class Ring:
    """A cp group seen as a ring: who is left and right, who holds which chunks."""

    g: Members
    layout: str

    def ids(self, step: int) -> tuple[int, int]:
        """The chunks whose K/V this rank holds at ring step `step` (rank r − step)."""
        return chunk_ids(self.g.size, (self.g.rank - step) % self.g.size, self.layout)

    def shift(self, x: Tensor) -> Tensor:
        """Send x to the rank on the right; return what the rank on the left sent."""
        if self.g.size == 1:
            return x
        right, left = self.g.peer(1), self.g.peer(-1)
        return p2p.send_recv(x, right, left, self.g.group)


def block_mask(
    q_chunk: int,
    k_chunk: int,
    c: int,
    causal: bool,
    device: torch.device | str | None = None,
) -> Tensor | str | None:
    """How queries of chunk `q_chunk` see keys of `k_chunk`: None (every score), a
    (c, c) boolean mask on `device` (the diagonal block: key at or before query) or
    SKIP. Made where the scores are: a host mask copied to a GPU at every block
    would stall the host each time."""
    if not causal or k_chunk < q_chunk:
        return None
    if k_chunk > q_chunk:
        return SKIP
    return torch.ones(c, c, dtype=torch.bool, device=device).tril()


def _scores(q: Tensor, k: Tensor, mask: Tensor | None, scale: float) -> Tensor:
    s = (q @ repeat_kv(k, q.size(1)).transpose(-2, -1)) * scale  # (B, H, c, c)
    return s if mask is None else s.masked_fill(~mask, float("-inf"))


def repeat_kv(kv: Tensor, heads: int) -> Tensor:
    """K or V (B, Hkv, c, D) with each head repeated for the q heads that read it."""
    groups = heads // kv.size(1)
    return kv if groups == 1 else kv.repeat_interleave(groups, dim=1)


def sum_over_group(grad: Tensor, kv_heads: int) -> Tensor:
    """A gradient over q's heads (B, H, c, D) summed onto the K/V head each read."""
    return grad.unflatten(1, (kv_heads, -1)).sum(2)


def online_update(stats: Stats, s: Tensor, v: Tensor) -> Stats:
    """One block of scores s, values v, folded into a row's running (m, l, acc)."""
    m, l_, acc = stats
    new = torch.maximum(m, s.amax(-1, keepdim=True))
    alpha, p = torch.exp(m - new), torch.exp(s - new)  # alpha rescales the old sums
    return new, l_ * alpha + p.sum(-1, keepdim=True), acc * alpha + p @ v


def send_home(ring: Ring, buf: Tensor) -> tuple[Tensor, Tensor]:
    """The last pass: dK, dV (buf[2:]) sit one rank before their owner; hand them on."""
    grads = ring.shift(buf[2:].contiguous())
    return grads[0], grads[1]


def _forward(
    q: Tensor, k: Tensor, v: Tensor, ring: Ring, causal: bool, scale: float, work: Work
) -> tuple[Tensor, Tensor]:
    """(out, lse) of this rank's queries against every rank's keys."""
    qs, mine = q.chunk(2, dim=2), ring.ids(0)
    c = qs[0].size(2)
    stats = [  # per query chunk: running max, running sum, unnormalised output
        (
            torch.full_like(x[..., :1], float("-inf")),
            torch.zeros_like(x[..., :1]),
            torch.zeros_like(x),
        )
        for x in qs
    ]
    kv = torch.stack([k, v])  # one message: (2, B, Hkv, L, D)
    for step in range(ring.g.size):
        theirs, ks, vs = ring.ids(step), kv[0].chunk(2, 2), kv[1].chunk(2, 2)
        for a, b in ((a, b) for a in range(2) for b in range(2)):
            mask = block_mask(mine[a], theirs[b], c, causal, q.device)
            if isinstance(mask, str):
                continue
            s = _scores(qs[a], ks[b], mask, scale)
            stats[a] = online_update(stats[a], s, repeat_kv(vs[b], q.size(1)))
            work.blocks += 1
            work.scores += c * c if mask is None else c * (c + 1) // 2
        if step < ring.g.size - 1:
            kv = ring.shift(kv)
    out = torch.cat([acc / l_ for _, l_, acc in stats], dim=2)
    lse = torch.cat([m + l_.log() for m, l_, _ in stats], dim=2)
    return out, lse


def _backward(
    dout: Tensor, saved: tuple[Tensor, ...], ring: Ring, causal: bool, scale: float
) -> tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv of this rank's chunks: K/V and their gradients ring round."""
    q, k, v, out, lse = saved
    D = (dout * out).sum(-1, keepdim=True)  # (B, H, L, 1)
    dq = torch.zeros_like(q)
    qs, dos, Ds, lses, dqs = (t.chunk(2, 2) for t in (q, dout, D, lse, dq))
    mine, c, hkv = ring.ids(0), qs[0].size(2), k.size(1)
    buf = torch.stack([k, v, torch.zeros_like(k), torch.zeros_like(v)])
    for step in range(ring.g.size):
        theirs = ring.ids(step)
        ks, vs, dks, dvs = (t.chunk(2, 2) for t in buf)
        for a, b in ((a, b) for a in range(2) for b in range(2)):
            mask = block_mask(mine[a], theirs[b], c, causal, q.device)
            if isinstance(mask, str):
                continue
            p = torch.exp(_scores(qs[a], ks[b], mask, scale) - lses[a])
            dvs[b].add_(sum_over_group(p.transpose(-2, -1) @ dos[a], hkv))
            ds = p * (dos[a] @ repeat_kv(vs[b], q.size(1)).transpose(-2, -1) - Ds[a])
            dqs[a].add_(ds @ repeat_kv(ks[b], q.size(1)), alpha=scale)
            dks[b].add_(sum_over_group(ds.transpose(-2, -1) @ qs[a], hkv), alpha=scale)
        if step < ring.g.size - 1:
            buf = ring.shift(buf)
    return dq, *send_home(ring, buf)


class _RingAttention(torch.autograd.Function):
    """Ring attention with its own backward (module docstring): saves q, k, v, out
    and lse, this rank's chunks only."""

    @staticmethod
    def forward(
        ctx: Any,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        ring: Ring,
        causal: bool,
        scale: float,
        work: Work,
    ) -> Tensor:
        out, lse = _forward(q, k, v, ring, causal, scale, work)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring, ctx.causal, ctx.scale = ring, causal, scale
        return out

    @staticmethod
    def backward(ctx: Any, dout: Tensor) -> tuple:
        saved = ctx.saved_tensors
        grads = _backward(dout.contiguous(), saved, ctx.ring, ctx.causal, ctx.scale)
        return (*grads, None, None, None, None)


def check_inputs(
    q: Tensor, k: Tensor, v: Tensor, cp: int, layout: str, name: str = "ring_attention"
) -> int:
    """ValueError, before any message, unless q (B, H, L, D) and k, v (B, Hkv, L, D)
    share a dtype, B, L and D, Hkv divides H, and L cuts into this rank's two
    chunks. Returns Hkv."""
    check_layout(layout)
    for what, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor) or t.dim() != 4:
            got = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(f"{name}: {what} must be (B, H, L, D), got {got}")
    want = (q.size(0), k.size(1), *q.shape[2:])
    for what, t in (("k", k), ("v", v)):
        if tuple(t.shape) != want or t.dtype != q.dtype:
            raise ValueError(
                f"{name}: {what} is {t.dtype}{list(t.shape)}, q is {q.dtype}"
                f"{list(q.shape)}; they must match but for k's and v's heads"
            )
    if q.size(1) % k.size(1):
        raise ValueError(
            f"{name}: q has {q.size(1)} heads but k and v have {k.size(1)}; "
            "grouped-query attention needs k's heads to divide q's"
        )
    check_sequence(q.size(2) * cp, cp)
    return k.size(1)


def ring_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    group: Group = None,
    *,
    causal: bool = True,
    layout: str = "zigzag",
    scale: float | None = None,
    check: bool = True,
    work: Work | None = None,
) -> Tensor:
    """Attention of this rank's queries over the whole sequence of the `group`.

    q (B, H, L, D), k and v (B, Hkv, L, D), Hkv dividing H: this rank's tokens in
    `layout`'s order (`split.shard`); the output is this rank's rows of
    `F.scaled_dot_product_attention` of the whole sequence (is_causal=causal,
    enable_gqa=True), with its gradients. `check` (the same on every
    rank) adds one all_gather of 112 bytes, so ranks whose shapes differ raise the
    same ValueError instead of hanging; local checks run first either way. `work`,
    if given, counts the blocks computed.
    """
    g = members(group, "ring_attention")
    hkv = check_inputs(q, k, v, g.size, layout)
    agree(
        "ring_attention",
        q,
        group,
        validate=lambda: hkv,
        key_name="kv heads",
        check=check,
    )
    scale = 1 / math.sqrt(q.size(-1)) if scale is None else scale
    ring = Ring(g, layout)
    work = Work() if work is None else work
    return _RingAttention.apply(q, k, v, ring, causal, scale, work)
