"""Boxing: change a global tensor's signature, one mesh dimension at a time.

On one mesh dimension (a group of n ranks), with the collectives of comm.autograd:

    S(i) -> B      all_gather          gather_from_group
    P -> B         all_reduce          reduce_from_group
    P -> S(i)      reduce_scatter      reduce_scatter_along
    B -> S(i)      keep my piece       split_to_group (no messages)
    S(i) -> S(j)   all_to_all          all_to_all_along
    B -> P         coordinate 0 keeps the value, the others hold zeros (no messages):
                   the sum over ranks is the value, which is all P asks
    S(i) -> P      my piece in place in a zero tensor of the whole shape (no messages)

These functions move plain local tensors and have no autograd of their own: they
run inside an op (below autograd) or inside tensor.Redistribute, whose backward
boxes the gradient. On 2-D placements a mesh dimension converts directly unless a
later mesh dimension splits the same tensor dim (nesting): then those dimensions go
to B innermost first and come back outermost first.
"""

from __future__ import annotations

import torch
from torch import Tensor

from distcourse.comm.autograd import (
    all_to_all_along,
    gather_from_group,
    reduce_from_group,
    reduce_scatter_along,
    split_to_group,
)
from distcourse.comm.ledger import ring_wire_bytes
from distcourse.global_tensor import debug
from distcourse.global_tensor.placement import Placement
from distcourse.global_tensor.sbp import (
    SBP,
    Broadcast,
    PartialSum,
    Signature,
    Split,
    local_shape,
    piece,
)

B, P = Broadcast(), PartialSum()


def collective(src: SBP, dst: SBP) -> str:
    """The name of what converts src to dst on one mesh dimension."""
    if src == dst:
        return "nothing"
    if isinstance(src, Split):
        return {B: "all_gather", P: "place in zeros"}.get(dst, "all_to_all")
    if src == P:
        return "all_reduce" if dst == B else "reduce_scatter"
    return "slice" if isinstance(dst, Split) else "zeros off coordinate 0"


def convert(
    x: Tensor, pl: Placement, dim: int, src: SBP, dst: SBP, size: tuple[int, ...]
) -> Tensor:
    """x's conversion on mesh dimension `dim`; `size` is the shape the group holds
    together (the logical shape less the splits of outer mesh dimensions)."""
    if src == dst:
        return x
    group, c = pl.groups[dim], pl.coord[dim]
    if debug.active():
        debug.record(f"    mesh dim {dim}: {src!r} -> {dst!r}  {collective(src, dst)}")
    if isinstance(src, Split):  # the pieces' lengths follow from the logical shape
        n = pl.hierarchy[dim]
        sizes = [piece(size[src.dim], n, k)[1] for k in range(n)]
        if dst == B:
            return gather_from_group(x, src.dim, group, check=False, sizes=sizes)
        if isinstance(dst, Split):
            return all_to_all_along(
                x, dst.dim, src.dim, group, check=False, sizes=sizes
            )
        whole = list(x.shape)  # S -> P; no later mesh dim splits src.dim (plan)
        whole[src.dim] = size[src.dim]
        out = x.new_zeros(whole)
        start, length = piece(size[src.dim], pl.hierarchy[dim], c)
        out.narrow(src.dim, start, length).copy_(x)
        return out
    if src == P:
        if dst == B:
            return reduce_from_group(x, group, check=False)
        return reduce_scatter_along(x, dst.dim, group, check=False)
    if isinstance(dst, Split):  # B -> S
        return split_to_group(x, dst.dim, group, check=False)
    return x if c == 0 else torch.zeros_like(x)  # B -> P


def _splits(*sbps: SBP) -> set[int]:
    return {s.dim for s in sbps if isinstance(s, Split)}


def plan(src: Signature, dst: Signature) -> tuple[list[int], bool]:
    """The mesh dims to convert, and whether they convert directly (no nesting)."""
    dirty = [k for k in range(len(src)) if src[k] != dst[k]]
    direct = True
    for k in list(dirty):
        for j in range(k + 1, len(src)):
            if j not in dirty and _splits(src[k], dst[k]) & _splits(src[j], dst[j]):
                dirty.append(j)
                direct = False
    for k in dirty:
        for j in dirty:
            if j > k and _splits(src[k], dst[k]) & _splits(src[j], dst[j]):
                direct = False
    return sorted(set(dirty)), direct


def box(
    x: Tensor, pl: Placement, src: Signature, dst: Signature, shape: tuple[int, ...]
) -> Tensor:
    """The local piece under `dst` of the global tensor whose piece under `src` is x.

    `shape` is the logical shape. Every rank of the placement must call it with the
    same arguments (they are metadata that every rank holds alike).
    """
    for k, before, now in steps(src, dst):
        size = local_shape(shape, before[:k], pl.hierarchy[:k], pl.coord[:k])
        x = convert(x, pl, k, before[k], now[k], size)
    return x


def steps(src: Signature, dst: Signature) -> list[tuple[int, Signature, Signature]]:
    """The one-mesh-dimension conversions from src to dst, in order: (mesh dim,
    signature before, signature after)."""
    dims, direct = plan(src, dst)
    order = [(k, dst[k]) for k in reversed(dims)]
    if not direct:  # to B innermost first, then to dst outermost first
        order = [(k, B) for k in reversed(dims)] + [(k, dst[k]) for k in dims]
    out, now = [], tuple(src)
    for k, target in order:
        after = now[:k] + (target,) + now[k + 1 :]
        if after != now:
            out.append((k, now, after))
        now = after
    return out


# The convention's cost of each collective on a ring of n ranks, T the bytes the
# group holds together (chapter 6's table): what one rank puts on the wire
FORMULAS = {
    "all_gather": "(n-1)T/n",
    "reduce_scatter": "(n-1)T/n",
    "all_reduce": "2(n-1)T/n",  # a reduce_scatter, then an all_gather
    "all_to_all": "(n-1)T/n^2",  # my piece T/n, less what I keep
}


def formula(src: SBP, dst: SBP) -> str:
    """The wire bytes of one rank converting src to dst, as a formula ("0": a local
    conversion, no message)."""
    return FORMULAS.get(collective(src, dst), "0")


def transfer_bytes(
    src: SBP, dst: SBP, shape: tuple[int, ...], n: int, item: int
) -> int:
    """Bytes the rank at coordinate 0 puts on the wire converting a tensor of
    `shape` (what its group holds together, T bytes) from src to dst on one mesh
    dimension of n ranks: the book's one convention, as the Ledger counts it.

    Even pieces give `formula(src, dst)`: all_gather and reduce_scatter (n-1)T/n,
    all_reduce 2(n-1)T/n, all_to_all (n-1)/n of my piece T/n (the pieces' lengths
    follow from the logical shape: nothing is sent to learn them). Uneven pieces:
    all_gather and our ring reduce_scatter move n - 1 blocks of the longest piece
    (the others are padded to it); all_to_all my own piece less the part I keep
    (piece 0 of it along the new split's dim), which is (n-1)/n of it when that dim
    divides evenly. torch's all_gather and all_reduce are counted as the ring runs them
    (comm.ledger.ring_wire_bytes), its all_to_all exactly from the pieces (as the
    ledger counts it); the reduce_scatter is ours, sent by p2p.
    """
    total = torch.Size(shape).numel() * item
    kind = collective(src, dst)
    if n <= 1 or kind not in FORMULAS:
        return 0
    if kind == "all_reduce":
        return ring_wire_bytes("all_reduce", total, n)
    dim = src.dim if kind == "all_gather" else getattr(dst, "dim", 0)
    longest = total // shape[dim] * piece(shape[dim], n, 0)[1] if shape[dim] else 0
    if kind == "all_gather":
        return ring_wire_bytes("all_gather", longest, n)
    if kind == "reduce_scatter":
        return (n - 1) * longest  # our ring: n - 1 sends of one block
    mine = total // shape[src.dim] * piece(shape[src.dim], n, 0)[1]
    kept = mine // shape[dim] * piece(shape[dim], n, 0)[1] if shape[dim] else 0
    return mine - kept  # the pieces it sends the others; its own stays


def cost_line(
    src: SBP, dst: SBP, sent: int, shape: tuple[int, ...], n: int, item: int
) -> str:
    """Chapter 6's check of one conversion: the bytes a ledger saw rank 0 `sent`
    against transfer_bytes, with the collective and its formula. It fails when the
    conversion took another route (a P -> S done as all_reduce + slice sends
    2(n-1)T/n, not (n-1)T/n)."""
    want = transfer_bytes(src, dst, shape, n, item)
    verdict = "PASS" if sent == want else "FAIL"
    return (
        f"{src!r:>4} -> {dst!r:<4} {collective(src, dst):<22} "
        f"{formula(src, dst):<20} ledger {sent:>3} B, formula {want:>3} B {verdict}"
    )
