"""Chapter 12's exercises on expert parallelism: capacity, routing, counts, bytes.

1. `check_capacity(x)`: the most assignments one expert takes from a group of
   4096 tokens, with 64 experts, top-2 routing and a capacity factor of 1.25.
2. `check_route_top1(fn)`: `fn(logits, capacity) -> (expert, kept)`: top-1 routing
   of T tokens (logits (T, E)) with room for `capacity` tokens per expert, the
   tokens served in order; expert (T,) int64, kept (T,) bool.
3. `check_exchange_counts(fn)`: `fn(per_expert) -> (n, E / n)`: this rank's rows for
   each of the E = 8 experts in, the rows each of the n = 4 ranks sends to each of
   this rank's experts out (rank q holds experts 2q and 2q + 1); 4 gloo ranks.
4. `check_dispatch_bytes(x)`: rank 1 of 4 sends 10, 30, 20 and 40 rows to ranks 0,
   1, 2 and 3 in a dispatch, each row 1024 float32 values: the bytes it actually
   sends to other ranks.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from distcourse.exercises.core import (
    Problem,
    call,
    check_number,
    check_on_ranks,
    check_returns,
    compare,
)
from distcourse.parallel.experts import capacity

EXERCISES = ("capacity", "route_top1", "exchange_counts", "dispatch_bytes")


def check_capacity(answer: object) -> bool:
    """Capacity for 4096 tokens per group, 64 experts, top-2, factor 1.25: a number."""
    return check_number(
        "ch12_experts.capacity",
        answer,
        capacity(4096, 64, 2, 1.25),
        hint="each token makes k assignments; an even share is k T / E per expert, "
        "and the capacity factor leaves that much room again x 1.25 (rounded up)",
    )


def _logits() -> torch.Tensor:
    gen = torch.Generator().manual_seed(12)
    logits = torch.randn(12, 3, generator=gen)
    logits[:, 0] += 1.0  # expert 0 is popular: some of its tokens are dropped
    return logits


def check_route_top1(answer: object) -> bool:
    """`answer(logits, capacity) -> (expert, kept)`: 12 tokens, 3 experts, room 3."""
    logits, room = _logits(), 3
    expert = logits.argmax(dim=-1)
    one_hot = torch.nn.functional.one_hot(expert, logits.shape[1])
    position = (one_hot.cumsum(dim=0) - 1).gather(1, expert[:, None])[:, 0]
    return check_returns(
        "ch12_experts.route_top1",
        answer,
        (logits.clone(), room),
        {"expert": expert, "kept": position < room},
        hint="expert = logits.argmax(-1); a token's place in its expert's queue is "
        "how many earlier tokens chose the same expert (cumsum of a one-hot); it is "
        "kept when that place is below the capacity",
    )


def exchange_counts_probe(answer: object) -> Problem:
    """On each of 4 ranks: the counts received for this rank's two experts."""
    rank, n = dist.get_rank(), dist.get_world_size()
    per_expert = torch.arange(8) + 10 * rank  # rows for each of the 8 experts
    got = call(answer, per_expert.clone())
    want = torch.tensor([[2 * rank + 10 * s, 2 * rank + 1 + 10 * s] for s in range(n)])
    return compare(got, want, "the counts")


def check_exchange_counts(answer: object) -> bool:
    """`answer(per_expert) -> (4, 2)` counts, on 4 gloo ranks."""
    return check_on_ranks(
        "ch12_experts.exchange_counts",
        answer,
        exchange_counts_probe,
        4,
        hint="dist.all_to_all_single(out, per_expert) sends the i-th quarter of "
        "per_expert (the counts for rank i's experts) to rank i; view the result "
        "as (n, E / n): row s came from rank s",
    )


def check_dispatch_bytes(answer: object) -> bool:
    """Bytes rank 1 of 4 sends away for rows 10, 30, 20, 40 of 1024 float32."""
    return check_number(
        "ch12_experts.dispatch_bytes",
        answer,
        (10 + 20 + 40) * 1024 * 4,
        hint="the 30 rows rank 1 sends to itself never leave it; the ring's "
        "(n-1)T/n would assume the same share to every peer",
    )
