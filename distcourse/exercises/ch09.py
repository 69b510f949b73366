"""Chapter 9's exercises: what ZeRO's stages hold, FSDP's pieces, a sharded step.

1. `check_zero2_bytes(x)`: bytes of model state one rank holds under ZeRO-2 for a
   model of 10^9 parameters on 8 ranks, fp32 AdamW (this chapter's convention:
   4 bytes of parameter, 4 of gradient, 8 of optimizer state per parameter; leave out
   AdamW's step counters).
2. `check_zero3_bytes(x)`: the same under ZeRO-3 (FSDP).
3. `check_fsdp_rows(x)`: a Linear(8, 10) weight (10 rows) sharded by `fully_shard`
   on 4 ranks: how many rows each rank holds, as a list of 4 numbers.
4. `check_reduce_scatter_grads(fn)`: ZeRO-2's gradient step on one rank:
   `fn(flat_grad)` gets this rank's flat gradient (12 elements, different on every
   rank) and returns this rank's shard (chunk `rank` of 4) of the gradient averaged
   over the ranks; 4 ranks.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from distcourse.exercises.core import (
    Problem,
    call,
    check_number,
    check_on_ranks,
    check_per_rank,
    compare,
)
from distcourse.parallel.fsdp.layout import pieces
from distcourse.parallel.zero.memory import formula

EXERCISES = ("zero2_bytes", "zero3_bytes", "fsdp_rows", "reduce_scatter_grads")
PSI, RANKS = 10**9, 8


def _check_state(stage: int, answer: object, hint: str) -> bool:
    """Exercise `zero{stage}_bytes`: model state per rank under ZeRO-`stage`."""
    want = sum(formula(stage, PSI, PSI // RANKS, tensors=0).values())
    return check_number(f"ch09.zero{stage}_bytes", answer, want, hint=hint)


def check_zero2_bytes(answer: object) -> bool:
    """Bytes per rank, ZeRO-2, 10^9 parameters, 8 ranks, fp32 AdamW: a number."""
    hint = (
        "ZeRO-2 shards the gradients and the optimizer state (4 + 8 bytes per "
        "parameter, divided by N) and keeps every parameter (4 bytes): 4Ψ + 12Ψ/N"
    )
    return _check_state(2, answer, hint)


def check_zero3_bytes(answer: object) -> bool:
    """Bytes per rank, ZeRO-3, 10^9 parameters, 8 ranks, fp32 AdamW: a number."""
    hint = (
        "ZeRO-3 shards the parameters too: all 16 bytes per parameter are "
        "divided by N, 16Ψ/N (while a unit runs, it holds its gathered parameters "
        "as well)"
    )
    return _check_state(3, answer, hint)


def check_fsdp_rows(answer: object) -> bool:
    """Rows of a (10, 8) weight on each of 4 ranks under fully_shard: a list."""
    return check_per_rank(
        "ch09.fsdp_rows",
        answer,
        [pieces([torch.Size((10, 8))], 4, r)[0].rows for r in range(4)],
        what="row counts",
        hint="FSDP cuts dim 0 with torch.chunk: pieces of ceil(10 / 4) rows, the "
        "last rank gets what is left (and pads it for the collectives)",
    )


def reduce_scatter_grads_probe(answer: object) -> Problem:
    """On each rank: its flat gradient in, its shard of the average out."""
    rank, world = dist.get_rank(), dist.get_world_size()
    grads = [torch.arange(12.0) * (r + 1) - r for r in range(world)]
    out = call(answer, grads[rank].clone())
    mean = sum(grads) / world
    return compare(out, mean.chunk(world)[rank], "the shard")


def check_reduce_scatter_grads(answer: object) -> bool:
    """`answer(flat_grad) -> shard of the average`, 12 elements on 4 gloo ranks."""
    return check_on_ranks(
        "ch09.reduce_scatter_grads",
        answer,
        reduce_scatter_grads_probe,
        4,
        hint="a reduce-scatter (dist.reduce_scatter_single(out, flat_grad), "
        "reduce_scatter_tensor before torch 2.14) sums and leaves chunk `rank` on "
        "this rank (out has numel / world elements); then divide by the world size, "
        "as DDP averages",
    )
