"""Chapter 2's exercises: collectives from messages, and what they cost.

1. `check_ring_all_reduce(fn)`: `fn(tensor)` sums `tensor` over all ranks in place
   (and returns it), built from point-to-point messages only; 4 ranks, 10 elements.
2. `check_ring_reduce_scatter(fn)`: `fn(tensor)` returns this rank's chunk (chunk r on
   rank r) of the sum over ranks, as `dist.reduce_scatter_tensor` would; 4 ranks.
3. `check_all_reduce_bytes(x)`: bytes one rank puts on the wire in a ring all-reduce
   of T = 64 MiB on n = 8 ranks.
4. `check_all_gather_bytes(x)`: bytes one rank sends in a ring all-gather whose output
   is 1 MiB, on 4 ranks.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from distcourse.comm.ledger import Ledger, ring_wire_bytes
from distcourse.exercises.core import (
    Problem,
    call,
    check_number,
    check_on_ranks,
    compare,
)

EXERCISES = (
    "ring_all_reduce",
    "ring_reduce_scatter",
    "all_reduce_bytes",
    "all_gather_bytes",
)
MIB = 2**20


def _inputs(numel: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's tensor (distinct on every rank) and the sum over ranks."""
    rank, world = dist.get_rank(), dist.get_world_size()
    make = lambda r: torch.arange(numel, dtype=torch.float32) * (r + 1) + r  # noqa: E731
    total = sum(make(r) for r in range(world))
    return make(rank), total


def _collectives(ledger: Ledger) -> list[str]:
    return sorted({r.op for r in ledger.records if r.kind == "collective"})


def ring_all_reduce_probe(answer: object) -> Problem:
    """On each rank: the answer's sum, and that it sent only messages."""
    mine, total = _inputs(10)
    with Ledger() as ledger:
        out = call(answer, mine)
    used = _collectives(ledger)
    if used:
        return (
            f"it calls {', '.join(used)}: build it from point-to-point messages "
            "(dist.batch_isend_irecv)"
        )
    if out is None:
        out = mine  # in place, like dist.all_reduce
    return compare(out, total, "the result")


def check_ring_all_reduce(answer: object) -> bool:
    """`answer(tensor)`: the sum over ranks, in place, from messages; 4 gloo ranks."""
    return check_on_ranks(
        "ch02.ring_all_reduce",
        answer,
        ring_all_reduce_probe,
        4,
        hint="cut the tensor into n chunks (torch.tensor_split); n-1 steps pass chunk "
        "(rank - s) % n to rank + 1 and add the one received (reduce-scatter), n-1 "
        "more pass the finished chunks on (all-gather); post each step's send and "
        "receive as one dist.batch_isend_irecv (separate calls deadlock on NCCL)",
    )


def ring_reduce_scatter_probe(answer: object) -> Problem:
    """On each rank: the answer's chunk against chunk `rank` of the sum."""
    rank, world = dist.get_rank(), dist.get_world_size()
    mine, total = _inputs(4 * world)
    out = call(answer, mine.clone())
    return compare(out, total.chunk(world)[rank], "the chunk")


def check_ring_reduce_scatter(answer: object) -> bool:
    """`answer(tensor) -> chunk`: chunk `rank` of the sum over ranks; 4 gloo ranks."""
    return check_on_ranks(
        "ch02.ring_reduce_scatter",
        answer,
        ring_reduce_scatter_probe,
        4,
        hint="the first loop of ring_all_reduce: after n-1 steps rank r holds the "
        "full sum of chunk (r + 1) % n; start one chunk earlier, or send it on once "
        "more, so that rank r ends with chunk r (dist.reduce_scatter_tensor's order)",
    )


def check_all_reduce_bytes(answer: object) -> bool:
    """Wire bytes per rank of a ring all-reduce, T = 64 MiB, n = 8: a number."""
    return check_number(
        "ch02.all_reduce_bytes",
        answer,
        ring_wire_bytes("all_reduce", 64 * MIB, 8),
        hint="reduce-scatter then all-gather: each sends n-1 chunks of T/n",
    )


def check_all_gather_bytes(answer: object) -> bool:
    """Bytes a rank sends in a ring all-gather with a 1 MiB output on 4 ranks."""
    n, t = 4, MIB
    return check_number(
        "ch02.all_gather_bytes",
        answer,
        (n - 1) * t / n,
        hint="each rank forwards the n-1 pieces it does not start with, T/n each; "
        "count with Ledger().bytes_sent() around comm.ring_all_gather",
    )
