"""Which tokens of a sequence each rank of a context-parallel group holds.

A sequence of T tokens is cut into 2·cp chunks of c = T / (2·cp) tokens, and each
rank holds two of them, side by side along the sequence dimension:

    layout       rank r holds chunks        cp = 2, T = 8 (chunks of 2)
    "zigzag"     r and 2·cp − 1 − r         rank 0: 0 1 | 6 7    rank 1: 2 3 | 4 5
    "contiguous" 2r and 2r + 1              rank 0: 0 1 | 2 3    rank 1: 4 5 | 6 7

Both layouts use the same chunks, so ring attention computes the same blocks of
scores in either and the only difference is who computes which. With a causal mask,
a query may attend only to keys at or before it: under "contiguous" the last rank's
queries see the whole sequence and the first rank's almost nothing; "zigzag" pairs an
early chunk with a late one, so every rank computes the same number of blocks
(`cost.work_blocks`). "zigzag" is what Megatron-LM and PyTorch's `context_parallel`
(its head-tail load balancer) do, and chapter 5's V-shaped pipelines use the same
pairing of r with 2p − 1 − r.

Everything here is local arithmetic, checked before any message: a sequence that does
not cut into 2·cp chunks is a ValueError naming both numbers.
"""

from __future__ import annotations

import torch
from torch import Tensor

from distcourse.arguments import positive_int

LAYOUTS = ("zigzag", "contiguous")


def check_layout(layout: object) -> str:
    """`layout` if it is one of LAYOUTS; else ValueError listing them."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r} is not one of {', '.join(LAYOUTS)}")
    return layout  # type: ignore[return-value]


def check_sequence(seq: int, cp: int) -> int:
    """The chunk length T / (2·cp); ValueError if T does not cut into 2·cp chunks."""
    positive_int(cp, "cp")
    if not isinstance(seq, int) or seq < 1 or seq % (2 * cp):
        raise ValueError(
            f"a sequence of {seq} tokens does not split into 2 x cp = {2 * cp} "
            f"equal chunks (context parallelism over cp={cp} ranks, two chunks "
            "per rank)"
        )
    return seq // (2 * cp)


def chunk_ids(cp: int, rank: int, layout: str = "zigzag") -> tuple[int, int]:
    """The two chunks (of 2·cp) rank `rank` of a group of `cp` holds, in its order."""
    positive_int(cp, "cp")
    if not 0 <= rank < cp:
        raise ValueError(f"rank={rank} is not a rank of a group of cp={cp}")
    if check_layout(layout) == "zigzag":
        return rank, 2 * cp - 1 - rank
    return 2 * rank, 2 * rank + 1


def positions(seq: int, cp: int, rank: int, layout: str = "zigzag") -> Tensor:
    """The global positions (int64) of the tokens rank `rank` holds, in its order.

    A model with learned or rotary positions must use these, not arange(T / cp):
    the local tokens of rank 1 under "zigzag" are not tokens 0, 1, 2, ...
    """
    c = check_sequence(seq, cp)
    ids = chunk_ids(cp, rank, layout)
    return torch.cat([torch.arange(i * c, (i + 1) * c) for i in ids])


def shard(x: Tensor, dim: int, cp: int, rank: int, layout: str = "zigzag") -> Tensor:
    """This rank's tokens of a whole sequence `x` (sequence along `dim`), a copy."""
    c = check_sequence(x.size(dim), cp)
    ids = chunk_ids(cp, rank, layout)
    return torch.cat([x.narrow(dim, i * c, c) for i in ids], dim).contiguous()


def unshard(pieces: list[Tensor], dim: int, layout: str = "zigzag") -> Tensor:
    """The whole sequence from every rank's piece (pieces[r] from rank r), in order."""
    cp = len(pieces)
    chunks: dict[int, Tensor] = {}
    for rank, piece in enumerate(pieces):
        for i, part in zip(
            chunk_ids(cp, rank, layout), piece.chunk(2, dim), strict=True
        ):
            chunks[i] = part
    return torch.cat([chunks[i] for i in range(2 * cp)], dim)
