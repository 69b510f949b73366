"""Chapter 6's exercises: pieces, boxing bytes, matmul's signatures, a gather.

1. `check_pieces(x)`: a (5, 3) tensor under S(1) on 4 ranks: the shape of each
   rank's piece, as a list of 4 tuples (pieces as `torch.tensor_split` cuts them).
2. `check_boxing_bytes(x)`: bytes rank 0 puts on the wire boxing that (5, 3) float32
   tensor from S(0) to S(1) on 4 ranks (`transfer_bytes`, the Ledger's count).
3. `check_matmul_sbp(table)`: for `x @ w` on one mesh dimension, the output's SBP for
   each pair of operand SBPs: a dict with the keys of `MATMUL` ('S(0) x B', ...) and
   values 'S(0)', 'S(1)', 'B' or 'P'.
4. `check_gather_pieces(fn)`: `fn(piece)` receives this rank's rows of a (5, 3)
   tensor under S(0) on 4 ranks (2, 1, 1, 1 rows) and returns the whole tensor on
   every rank: the boxing S(0) -> B, by hand.
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
    check_table,
    compare,
)
from distcourse.global_tensor.boxing import transfer_bytes
from distcourse.global_tensor.sbp import local_shape, piece, split

EXERCISES = ("pieces", "boxing_bytes", "matmul_sbp", "gather_pieces")
SHAPE, RANKS = (5, 3), 4
MATMUL = {  # x's SBP x w's SBP -> the output's, as rules.py lists them
    "S(0) x B": "S(0)",
    "B x S(1)": "S(1)",
    "S(1) x S(0)": "P",
    "P x B": "P",
    "B x B": "B",
}


def check_pieces(answer: object) -> bool:
    """Each of 4 ranks' piece shapes of a (5, 3) tensor under S(1)."""
    return check_per_rank(
        "ch06.pieces",
        answer,
        [local_shape(SHAPE, (split(1),), (RANKS,), (c,)) for c in range(RANKS)],
        what="shapes",
        hint="S(1) cuts dimension 1 (3 columns) into 4 pieces as torch.tensor_split "
        "does: the first 3 % 4 pieces get one column more; a piece may be empty",
    )


def check_boxing_bytes(answer: object) -> bool:
    """Rank 0's wire bytes boxing a (5, 3) float32 tensor S(0) -> S(1), 4 ranks."""
    return check_number(
        "ch06.boxing_bytes",
        answer,
        transfer_bytes(split(0), split(1), SHAPE, RANKS, 4),
        hint="S(0) -> S(1) is an all_to_all: rank 0 sends its own piece (2 rows x "
        "3 columns x 4 bytes) less the part it keeps, its S(1) column (3 columns "
        "on 4 ranks: 1, 1, 1, 0); the pieces' sizes follow from the logical shape, "
        "so none travel",
    )


def check_matmul_sbp(answer: object) -> bool:
    """Matmul's output SBP for five operand pairs: a dict like `MATMUL`'s keys."""
    return check_table(
        "ch06.matmul_sbp",
        answer,
        MATMUL,
        hint="split rows of x give split rows of the output; split columns of w give "
        "split columns; x's columns against w's rows give each rank a partial sum; "
        "a partial sum times a whole stays partial",
    )


def gather_pieces_probe(answer: object) -> Problem:
    """On each rank: its S(0) rows of the (5, 3) tensor in, the whole tensor out."""
    rank, world = dist.get_rank(), dist.get_world_size()
    whole = torch.arange(15.0).reshape(SHAPE)
    start, rows = piece(SHAPE[0], world, rank)
    out = call(answer, whole[start : start + rows].clone())
    return compare(out, whole, "the gathered tensor", atol=0)


def check_gather_pieces(answer: object) -> bool:
    """`answer(piece) -> whole (5, 3) tensor`, S(0) pieces of 2, 1, 1, 1 rows."""
    return check_on_ranks(
        "ch06.gather_pieces",
        answer,
        gather_pieces_probe,
        4,
        hint="dist.all_gather needs pieces of one size: pad every piece to the "
        "longest (2 rows), gather, then cut each rank's rows back to its length "
        "(torch.tensor_split's sizes) before torch.cat",
    )
