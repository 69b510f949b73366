"""Chapter 7's exercises: the SBP of a gradient, its bytes, g by hand.

1. `check_grad_sbp(table)`: the dual of each SBP: for a tensor held as 'S(0)',
   'S(1)', 'B' or 'P' (the keys), the SBP its gradient arrives with (the values).
2. `check_dp_grad_bytes(x)`: a data-parallel weight of 1 MiB (float32, SBP B) on 4
   ranks: bytes one rank sends to box its gradient to B, as the Ledger counts them.
3. `check_row_parallel(fn)`: `fn(x_piece, w_piece)` is a row-parallel linear layer
   without bias: x split along its features (S(1)), the weight (out, in) along its
   inputs (S(1)); it returns the whole output on every rank, with gradients that
   match one process (the job of g); 4 ranks.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from distcourse.comm.ledger import ring_wire_bytes
from distcourse.exercises.core import (
    Problem,
    call,
    check_number,
    check_on_ranks,
    check_table,
    compare,
)

EXERCISES = ("grad_sbp", "dp_grad_bytes", "row_parallel")
DUAL = {"S(0)": "S(0)", "S(1)": "S(1)", "B": "P", "P": "B"}


def check_grad_sbp(answer: object) -> bool:
    """The gradient's SBP for each forward SBP: a dict with keys S(0), S(1), B, P."""
    return check_table(
        "ch07.grad_sbp",
        answer,
        DUAL,
        hint="a broadcast tensor was used by every rank, so each rank's gradient is "
        "one part of a sum (P); a partial sum's gradient reaches every part whole "
        "(B); a split keeps its split",
    )


def check_dp_grad_bytes(answer: object) -> bool:
    """Wire bytes per rank boxing a 1 MiB gradient P -> B on 4 ranks: a number."""
    return check_number(
        "ch07.dp_grad_bytes",
        answer,
        ring_wire_bytes("all_reduce", 2**20, 4),
        hint="the gradient of a B weight arrives as P; P -> B is an all_reduce, "
        "2(n-1)T/n on a ring: data parallelism's all-reduce",
    )


def row_parallel_probe(answer: object) -> Problem:
    """On each rank: output and both gradients against one process's x @ w.T."""
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(3, 8, generator=g), torch.randn(5, 8, generator=g)
    c = torch.arange(15.0).reshape(3, 5)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    (xr @ wr.T * c).sum().backward()
    xp = x.chunk(world, 1)[rank].clone().requires_grad_()
    wp = w.chunk(world, 1)[rank].clone().requires_grad_()
    y = call(answer, xp, wp)
    problem = compare(y, x @ w.T, "the output", atol=1e-4)
    if problem:
        return problem
    call(lambda: (y * c).sum().backward(), what="the backward of your layer")
    checks = [
        (xp.grad, xr.grad.chunk(world, 1)[rank], "x_piece's gradient"),
        (wp.grad, wr.grad.chunk(world, 1)[rank], "w_piece's gradient"),
    ]
    return next(filter(None, (compare(*c, atol=1e-4) for c in checks)), None)


def check_row_parallel(answer: object) -> bool:
    """`answer(x_piece, w_piece) -> whole output`, gradients as one process's."""
    return check_on_ranks(
        "ch07.row_parallel",
        answer,
        row_parallel_probe,
        4,
        hint="x_piece @ w_piece.T is a partial sum (P); g turns it into B with an "
        "all_reduce forward and passes the gradient through unchanged backward (a "
        "torch.autograd.Function); torch.distributed.nn's all_reduce also sums the "
        "gradient, n times too much",
    )
