"""All-reduce along a binomial tree: reduce up to the root, then broadcast down.

A tree takes 2 * ceil(log2 N) rounds where a ring takes 2(N-1) steps, so it pays
fewer latencies alpha; but every round moves the whole tensor, so the root sends
ceil(log2 N) * S bytes against 2(N-1)/N * S per rank for the ring. Libraries use
trees for small messages and rings for large ones. The broadcast half,
`tree_broadcast`, doubles the holders each round; `costmodel.sent_per_rank`
says what each rank must send.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from distcourse.comm.agree import (
    SUM,
    Group,
    agree,
    copy_back,
    members,
)
from distcourse.comm.ring import reduction


def tree_broadcast(
    tensor: Tensor, src: int = 0, group: Group = None, check: bool = True
) -> Tensor:
    """Copy `src`'s tensor to every rank along a binomial tree: ceil(log2 N) rounds.

    In round k, every rank that has the data sends it 2**k places on, so the number of
    holders doubles. `src` is a rank in `group` (the global rank for the default
    group). `check` as in ring.ring_all_reduce.
    """
    g = members(group, "tree_broadcast")

    def source_rank() -> int:
        if not isinstance(src, int) or not 0 <= src < g.size:
            raise ValueError(
                f"tree_broadcast: src={src!r} is out of range: valid "
                f"ranks are 0..{g.size - 1}"
            )
        return src

    agree(
        "tree_broadcast",
        tensor,
        group,
        validate=source_rank,
        key_name="src",
        check=check,
    )
    flat = tensor.reshape(-1)
    me = (g.rank - src) % g.size  # my place in the tree; the source is 0
    mask = 1
    while mask < g.size and flat.numel():
        if me < mask and me + mask < g.size:
            dist.isend(flat, g.peer(mask), group=g.group).wait()
        elif mask <= me < 2 * mask:
            dist.irecv(flat, g.peer(-mask), group=g.group).wait()
        mask *= 2
    copy_back(tensor, flat)
    return tensor


def tree_reduce(
    tensor: Tensor, op: object = SUM, group: Group = None, check: bool = True
) -> Tensor:
    """In-place reduce to group rank 0 along a binomial tree: ceil(log2 N) rounds.

    In round k (mask = 2**k), a rank whose lowest set bit is k sends its partial
    result to rank - mask and is done; a rank below it adds what it receives. Only
    rank 0's tensor holds the result; the others hold partial sums (as dist.reduce
    leaves them, scratch). `check` as in ring_all_reduce.
    """
    g, reduce, flat = reduction("tree_reduce", tensor, op, group, check)
    buf = torch.empty_like(flat) if flat.numel() else flat
    mask = 1
    while mask < g.size and flat.numel():
        if g.rank & mask:  # my turn: hand my partial result up, towards the root
            dist.isend(flat, g.ranks[g.rank - mask], group=g.group).wait()
            break
        if g.rank + mask < g.size:  # a child this round: add its partial result
            dist.irecv(buf, g.ranks[g.rank + mask], group=g.group).wait()
            reduce(flat, buf, out=flat)
        mask *= 2
    if not tensor.is_contiguous():  # reshape(-1) made a copy, not a view
        tensor.copy_(flat.view(tensor.shape))
    return tensor


def tree_all_reduce(
    tensor: Tensor, op: object = SUM, group: Group = None, check: bool = True
) -> Tensor:
    """In-place all-reduce: `tree_reduce` to group rank 0, then `tree_broadcast` back.

    2 * ceil(log2 N) rounds of the whole tensor. Like dist.all_reduce, but returns
    `tensor`. `check` as in ring_all_reduce.
    """
    reduction("tree_all_reduce", tensor, op, group, check)  # one check for both
    tree_reduce(tensor, op, group, check=False)
    return tree_broadcast(tensor, 0, group, check=False)
