"""Chapter 12b's exercises: context parallelism (ring attention).

1. `check_merge(fn)`: `fn(out_a, lse_a, out_b, lse_b) -> (out, lse)` merges the
   attention of the same queries over two sets of keys, each given normalised with
   its log-sum-exp per row ((B, H, L, D) and (B, H, L, 1)), into the attention over
   both sets and its log-sum-exp: the step ring attention repeats as K/V arrive.
2. `check_positions(fn)`: `fn(seq, cp, rank)` -> the global positions (a LongTensor)
   of the tokens rank `rank` holds under the zig-zag split of `seq` tokens.
3. `check_ring_pass(fn)`: `fn(x)` sends `x` to rank + 1 and returns what rank − 1
   sent (one ring step), from point-to-point messages only; 4 gloo ranks.
4. `check_ring_bytes(x)`: data bytes one rank sends in the forward and backward of
   ring attention on cp = 8 ranks when its K chunk is 1 MiB (V the same; handshakes
   and the agreement check left out).
5. `check_contiguous_imbalance(x)`: causal attention split contiguously over cp = 8
   ranks: the busiest rank's blocks of scores over the mean per rank.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from distcourse.comm.ledger import Ledger
from distcourse.exercises.core import (
    Problem,
    call,
    check_answer,
    check_number,
    check_on_ranks,
    check_returns,
    compare,
)

EXERCISES = (
    "merge",
    "positions",
    "ring_pass",
    "ring_bytes",
    "contiguous_imbalance",
)
MIB = 2**20


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple:
    """(softmax(q kᵀ / √d) v, log-sum-exp of the scaled scores per row)."""
    s = q @ k.transpose(-2, -1) / q.size(-1) ** 0.5
    lse = torch.logsumexp(s, -1, keepdim=True)
    return torch.exp(s - lse) @ v, lse


def check_merge(answer: object) -> bool:
    """`answer(out_a, lse_a, out_b, lse_b) -> (out, lse)`, checked in this process:
    the merge of two halves of the keys against attention over all of them."""
    gen = torch.Generator().manual_seed(12)
    q, ka, va, kb, vb = (torch.randn(2, 2, 5, 4, generator=gen) for _ in range(5))
    kb = kb * 4  # scores of very different sizes: a merge must rescale, not add
    out, lse = _attend(q, torch.cat([ka, kb], 2), torch.cat([va, vb], 2))
    return check_returns(
        "ch12_context.merge",
        answer,
        (*_attend(q, ka, va), *_attend(q, kb, vb)),
        {"out": out, "lse": lse},
        hint="lse = logaddexp(lse_a, lse_b); each half's output counts with the "
        "share of the probability mass it saw: out = exp(lse_a - lse) out_a + "
        "exp(lse_b - lse) out_b",
    )


def positions_judge(answer: object) -> Problem:
    """The answer's positions against the zig-zag split, for a few sizes."""
    for seq, cp in ((8, 2), (24, 3), (32, 4)):
        c = seq // (2 * cp)
        for rank in range(cp):
            chunks = (rank, 2 * cp - 1 - rank)
            want = torch.cat([torch.arange(i * c, (i + 1) * c) for i in chunks])
            got = call(answer, seq, cp, rank)
            what = f"positions({seq}, {cp}, {rank})"
            if isinstance(got, torch.Tensor) and got.dtype != torch.int64:
                return f"{what} is {got.dtype}; embeddings need int64 indices"
            problem = compare(got, want, what, atol=0)
            if problem:
                return problem
    return None


def check_positions(answer: object) -> bool:
    """`answer(seq, cp, rank)`: the zig-zag positions, checked in this process."""
    return check_answer(
        "ch12_context.positions",
        answer,
        positions_judge,
        hint="2·cp chunks of c = seq / (2·cp) tokens; rank r holds chunks r and "
        "2·cp − 1 − r, in that order: torch.arange(i * c, (i + 1) * c) for each",
    )


def ring_pass_probe(answer: object) -> Problem:
    """On each rank: what arrived is the left neighbour's tensor, sent by p2p."""
    rank, n = dist.get_rank(), dist.get_world_size()
    mine = torch.arange(6.0) + 10 * rank
    with Ledger() as ledger:
        got = call(answer, mine.clone())
    used = sorted({r.op for r in ledger.records if r.kind == "collective"})
    if used:
        return f"it calls {', '.join(used)}: one ring step is a send and a receive"
    return compare(got, torch.arange(6.0) + 10 * ((rank - 1) % n), "what arrived")


def check_ring_pass(answer: object) -> bool:
    """`answer(x)`: x to rank + 1, the tensor of rank − 1 back; 4 gloo ranks."""
    return check_on_ranks(
        "ch12_context.ring_pass",
        answer,
        ring_pass_probe,
        4,
        hint="post dist.isend(x, (rank + 1) % n) and dist.irecv(buf, (rank - 1) % n) "
        "together, then wait on both: a blocking send first deadlocks the ring",
    )


def check_ring_bytes(answer: object) -> bool:
    """Data bytes per rank, forward + backward, cp = 8, K chunk 1 MiB: a number."""
    cp, x = 8, MIB
    return check_number(
        "ch12_context.ring_bytes",
        answer,
        (cp - 1) * 2 * x + (cp - 1) * 4 * x + 2 * x,
        hint="forward: cp − 1 passes of K and V; backward: cp − 1 passes of K, V, "
        "dK, dV, and one more of dK, dV to take the sums home",
    )


def check_contiguous_imbalance(answer: object) -> bool:
    """Busiest rank's causal blocks over the mean, contiguous, cp = 8: a number."""
    cp = 8
    blocks = [4 * r + 3 for r in range(cp)]
    return check_number(
        "ch12_context.contiguous_imbalance",
        answer,
        max(blocks) * cp / sum(blocks),
        hint="2·cp chunks; rank r holds 2r and 2r + 1; query chunk i computes i + 1 "
        "blocks (the keys at or before it); context.work_blocks counts them",
    )
