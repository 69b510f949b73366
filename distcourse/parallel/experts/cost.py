"""What expert parallelism sends and holds, by formula: for the checks and for a
planner choosing an ep degree.

One MoE layer, one training step (forward and backward), on a rank of an ep group
of n ranks, rows of C values of b bytes (row = C*b bytes). The forward makes three
all_to_alls: the counts (E int64 per rank), the dispatch (S rows handed in: the
rank's kept assignments) and the combine (R rows: what its experts computed);
the backward repeats the last two with the counts swapped (the dispatch's only
when the layer's input needs a gradient, as it does inside a model). Handed in
per step: 8E + 2(S + R) row bytes.

The book's convention: what crosses the wire per rank for the algorithm that runs.
An all_to_all sends each peer its piece directly, so a rank puts on the wire the
rows it addresses to the other ranks, as the ledger counts it (`step_bytes`):

    8E(n-1)/n + 2 (S - s_self + R - r_self) * row

where s_self (r_self) are the rows it sends to (receives from) itself: they never
leave the rank. The ring's (n-1)T/n of an all_to_all is the even case of this
count: a rank that sends every peer the same amount keeps 1/n of what it hands in.
So an even router that drops nothing sends 4(n-1)/n k T row + 8E(n-1)/n
(`balanced_bytes`, the planner's estimate).
"""

from __future__ import annotations

from collections.abc import Sequence

from distcourse.parallel.experts.dispatch import Traffic
from distcourse.parallel.experts.router import capacity


def handed_in(t: Traffic) -> int:
    """Bytes one layer's step hands to its all_to_alls on this rank."""
    rows = sum(t.sent) + sum(t.received)
    return 8 * t.counts + 2 * rows * t.row_bytes


def step_bytes(t: Traffic) -> int:
    """One layer's step: the bytes this rank sends to the other ranks of its group
    (the counts are even, E / n per peer), as the ledger counts its all_to_alls."""
    n = len(t.sent)
    counts = 8 * t.counts * (n - 1) // n
    away = sum(t.sent) - t.sent[t.rank] + sum(t.received) - t.received[t.rank]
    return counts + 2 * away * t.row_bytes


def balanced_bytes(
    tokens: int, n_embd: int, n_experts: int, top_k: int, ep: int, dtype_bytes: int = 4
) -> int:
    """One layer's step on one rank when every expert gets k T / E assignments from
    every rank and none is dropped: 4 (n-1)/n k T C b + 8 E (n-1)/n."""
    if ep == 1:
        return 0
    rows = top_k * tokens * n_embd * dtype_bytes
    return 4 * (ep - 1) * rows // ep + 8 * n_experts * (ep - 1) // ep


def expert_parameters(n_embd: int, hidden: int | None = None) -> int:
    """Parameters of one expert (the tiny GPT's MLP: C -> 4C -> C, with biases)."""
    h = 4 * n_embd if hidden is None else hidden
    return 2 * n_embd * h + h + n_embd


def memory_per_rank(
    tokens: int,
    n_embd: int,
    n_experts: int,
    top_k: int,
    capacity_factor: float,
    ep: int,
    dtype_bytes: int = 4,
) -> dict[str, int]:
    """Bytes one MoE layer puts on a rank: its E / ep experts' parameters (and as
    many for their gradients), the gate's, and the most rows its experts can be
    sent: capacity per group x ep groups x E / ep experts, each row in and out."""
    local = n_experts // ep
    room = capacity(tokens, n_experts, top_k, capacity_factor)
    return {
        "experts": local * expert_parameters(n_embd) * dtype_bytes,
        "gate": n_embd * n_experts * dtype_bytes,
        "buffers": 2 * room * ep * local * n_embd * dtype_bytes,
    }


def dispatch_matrix(
    expert: Sequence[int],
    token: Sequence[int],
    tokens_per_rank: int,
    local: int,
    n: int,
) -> list[list[int]]:
    """(n, n) rows rank s sends rank q, counted from a whole batch's assignments:
    token t lives on rank t // tokens_per_rank, expert e on rank e // local. The
    formula's side of the ledger check, counted from the routing, not from the
    split sizes the dispatch sent."""
    m = [[0] * n for _ in range(n)]
    for e, t in zip(expert, token, strict=True):
        m[t // tokens_per_rank][e // local] += 1
    return m


def routed_bytes(matrix: list[list[int]], rank: int, n_experts: int, row: int) -> int:
    """One layer's step on `rank` (forward and backward) from the dispatch matrix:
    8E(n-1)/n + 2 (rows to other ranks + rows from other ranks) * row bytes."""
    n = len(matrix)
    away = sum(matrix[rank]) - matrix[rank][rank]
    come = sum(r[rank] for r in matrix) - matrix[rank][rank]
    return 8 * n_experts * (n - 1) // n + 2 * (away + come) * row


def dropless_buffers(
    tokens: int,
    n_embd: int,
    n_experts: int,
    top_k: int,
    ep: int,
    dtype_bytes: int = 4,
) -> int:
    """The worst case of the rows a dropless layer's rank receives (and sends
    back): every token of the ep ranks routed to this rank's E / ep experts, at
    most min(k, E / ep) assignments per token, each row in and out. No capacity
    bounds it: the buffer is sized per step from the counts."""
    rows = min(top_k, n_experts // ep) * tokens * ep
    return 2 * rows * n_embd * dtype_bytes
