"""Collectives with a backward: the messages inside tensor and sequence parallelism.

A layer split across ranks calls a collective in its forward pass, and autograd needs
that collective's adjoint in the backward pass. Each row below is a pair in a
torch.autograd.Function, wrapped by a plain function taking `group=None`:

    function               forward                 backward
    copy_to_group          identity                all_reduce (sum)   Megatron's f
    reduce_from_group      all_reduce (sum)        identity           Megatron's g
    split_to_group         keep my slice           all_gather
    gather_from_group      all_gather              keep my slice
    all_gather_along       all_gather              reduce_scatter     sequence parallel
    reduce_scatter_along   reduce_scatter          all_gather
    all_to_all_along       all_to_all              all_to_all back    Ulysses attention

Uneven sizes follow torch.tensor_split: a split gives the first `size % n` ranks one
more element along `dim`. A gather takes any size per rank: it pads each piece to the
longest, moves equal blocks and trims, so it needs every rank's size. `sizes=` gives
them where the logical shape does (a global tensor's, a layer's even split): no
message. Otherwise a checked call reads them from its agreement's all_gather, which
carries one more int64 per rank; only an unchecked gather without `sizes` exchanges
them itself, one all_gather of an int64 per rank and a device-to-host copy (a
synchronization on a GPU) per gather.
Reduce-scatter is comm.ring's ring_reduce_scatter on every backend (old gloo lacks
it). `check=True` (the same on every rank) adds one all_gather of 112 bytes before the
forward moves data, so mismatched shapes raise one ValueError on every rank instead of
a hang; backwards need no check. A group of one rank is the identity.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from distcourse.comm.agree import Group, Members, agree, agree_lengths, members
from distcourse.comm.ring import ring_reduce_scatter


def _dim(x: Tensor, dim: int, name: str, what: str = "dim") -> int:
    """`dim` as a non-negative index into x's dims, or ValueError."""
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise ValueError(f"{name}: {what} must be an int, got {dim!r}")
    if not -x.dim() <= dim < x.dim():
        raise ValueError(
            f"{name}: {what}={dim} is out of range for a {x.dim()}-d "
            f"tensor of shape {list(x.shape)}"
        )
    return dim % x.dim()


def split_sizes(size: int, n: int) -> list[int]:
    """Sizes of torch.tensor_split(range(size), n): the first size % n one longer."""
    return [size // n + (r < size % n) for r in range(n)]


def _sizes(x: Tensor, dim: int, g: Members, known: list[int] | None) -> list[int]:
    """Every rank's x.size(dim): `known` when the caller or the agreement gave them,
    else by one all_gather of one int64 each (and a host copy of the result)."""
    if known is not None:
        return known
    mine = torch.tensor([x.size(dim)], dtype=torch.int64, device=x.device)
    rows = [torch.empty_like(mine) for _ in range(g.size)]
    dist.all_gather(rows, mine, group=g.group)
    return torch.cat(rows).tolist()


def _given(
    sizes: Sequence[int] | None, x: Tensor, dim: int, g: Members, name: str
) -> list[int] | None:
    """`sizes` as a list, checked on this rank: one non-negative int per rank, and
    this rank's equal to x.size(dim); None stays None."""
    if sizes is None:
        return None
    known = list(sizes)
    ok = all(isinstance(s, int) and s >= 0 for s in known) and len(known) == g.size
    if not ok or known[g.rank] != x.size(dim):
        raise ValueError(
            f"{name}: sizes={known} must give every one of the {g.size} ranks its "
            f"size along dim {dim}; this rank (group rank {g.rank}) holds "
            f"{x.size(dim)}"
        )
    return known


def _pad(x: Tensor, dim: int, size: int) -> Tensor:
    """x made contiguous and zero-padded at the end of `dim` to `size`."""
    pad = [0, 0] * (x.dim() - 1 - dim) + [0, size - x.size(dim)]  # last dim first
    return x.contiguous() if size == x.size(dim) else F.pad(x, pad)


def _gather(x: Tensor, dim: int, sizes: list[int], g: Members) -> Tensor:
    """Concatenate every rank's x along `dim`; rank r's piece is sizes[r] long."""
    block = _pad(x, dim, max(sizes))  # gloo's all_gather wants equal blocks
    blocks = [torch.empty_like(block) for _ in range(g.size)]
    dist.all_gather(blocks, block, group=g.group)
    pieces = [b.narrow(dim, 0, s) for b, s in zip(blocks, sizes, strict=True)]
    return torch.cat(pieces, dim)


def _reduce_scatter(x: Tensor, dim: int, sizes: list[int], g: Members) -> Tensor:
    """Sum x over ranks and keep piece g.rank along `dim` (pieces sizes[r] long)."""
    blocks = [_pad(p, dim, max(sizes)) for p in x.split(sizes, dim)]
    out = torch.empty_like(blocks[0])
    ring_reduce_scatter(
        out, torch.cat([b.reshape(-1) for b in blocks]), group=g.group, check=False
    )
    return out.narrow(dim, 0, sizes[g.rank]).contiguous()


def _all_reduce(x: Tensor, g: Members) -> Tensor:
    """A copy of x summed over ranks. Never in place: x may be an input or a gradient
    that autograd still holds elsewhere. Contiguous, as gloo requires."""
    out = x.clone(memory_format=torch.contiguous_format)
    dist.all_reduce(out, group=g.group)
    return out


def _all_to_all(
    x: Tensor,
    split_dim: int,
    send: list[int],
    cat_dim: int,
    recv: list[int],
    g: Members,
) -> Tensor:
    """Send piece j of x along `split_dim` (send[j] long) to rank j; concatenate the
    pieces received along `cat_dim`, the one from rank i recv[i] long. Every rank
    passes the same `send`, so what arrives is send[g.rank] long along `split_dim`."""
    pieces = [p.reshape(-1) for p in x.split(send, split_dim)]
    shape = list(x.shape)
    shape[split_dim] = send[g.rank]
    shapes = [shape[:cat_dim] + [c] + shape[cat_dim + 1 :] for c in recv]
    counts = [torch.Size(s).numel() for s in shapes]
    out = x.new_empty(sum(counts))
    dist.all_to_all_single(
        out, torch.cat(pieces), counts, [p.numel() for p in pieces], group=g.group
    )
    parts = [c.view(s) for c, s in zip(out.split(counts), shapes, strict=True)]
    return torch.cat(parts, cat_dim)


# Functions get the group as Members and sizes precomputed; they only move data.


class _Sum(torch.autograd.Function):
    """reduce_from_group (in_forward=True) and copy_to_group (False): a conjugate
    pair; one pass sums over ranks, the other passes its tensor through."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, g: Members, in_forward: bool) -> Tensor:
        ctx.g, ctx.in_forward = g, in_forward
        return _all_reduce(x, g) if in_forward else x

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple:
        return grad if ctx.in_forward else _all_reduce(grad, ctx.g), None, None


class _Scatter(torch.autograd.Function):
    """split_to_group (reduce=False) and reduce_scatter_along (reduce=True)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, dim: int, g: Members, reduce: bool) -> Tensor:
        ctx.dim, ctx.g, ctx.sizes = dim, g, split_sizes(x.size(dim), g.size)
        if reduce:
            return _reduce_scatter(x, dim, ctx.sizes, g)  # (..., sizes[rank], ...)
        return x.split(ctx.sizes, dim)[g.rank].contiguous()  # (..., sizes[rank], ...)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple:
        return _gather(grad, ctx.dim, ctx.sizes, ctx.g), None, None, None


class _Gather(torch.autograd.Function):
    """gather_from_group (reduce=False) and all_gather_along (reduce=True): the
    forwards are the same; only the backward differs, slice or reduce-scatter."""

    @staticmethod
    def forward(
        ctx: Any, x: Tensor, dim: int, sizes: list[int], g: Members, reduce: bool
    ) -> Tensor:
        ctx.dim, ctx.sizes, ctx.g, ctx.reduce = dim, sizes, g, reduce
        return _gather(x, dim, sizes, g)  # (..., sum(sizes), ...)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple:
        if ctx.reduce:
            grad = _reduce_scatter(grad, ctx.dim, ctx.sizes, ctx.g)
        else:
            grad = grad.split(ctx.sizes, ctx.dim)[ctx.g.rank].contiguous()
        return grad, None, None, None, None


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, x: Tensor, dims: tuple[int, int], cats: list[int], g: Members
    ) -> Tensor:
        ctx.dims, ctx.cats, ctx.g = dims, cats, g
        ctx.splits = split_sizes(x.size(dims[0]), g.size)
        return _all_to_all(x, dims[0], ctx.splits, dims[1], cats, g)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple:
        split_dim, cat_dim = ctx.dims  # send each rank's block back where it came from
        back = _all_to_all(grad, cat_dim, ctx.cats, split_dim, ctx.splits, ctx.g)
        return back, None, None, None


# Public functions: validate on this rank, agree across ranks, then move data.


def copy_to_group(x: Tensor, group: Group = None, check: bool = True) -> Tensor:
    """Megatron's f: x unchanged; the backward all-reduces (sums) its gradient.

    Put it where a replicated activation enters a tensor-parallel region: each rank
    uses x differently, so x's gradient is the sum of every rank's.
    """
    g = members(group, "copy_to_group")
    agree("copy_to_group", x, group, check=check)
    return x if g.size == 1 else _Sum.apply(x, g, False)


def reduce_from_group(x: Tensor, group: Group = None, check: bool = True) -> Tensor:
    """Megatron's g: the sum of x over ranks; the backward passes the gradient on.

    Put it where partial results leave a tensor-parallel region; everything after it
    is replicated, so each rank's gradient is already the whole gradient.
    """
    g = members(group, "reduce_from_group")
    agree("reduce_from_group", x, group, check=check)
    return x if g.size == 1 else _Sum.apply(x, g, True)


def split_to_group(
    x: Tensor, dim: int, group: Group = None, check: bool = True
) -> Tensor:
    """This rank's tensor_split piece of a replicated x along `dim`; no messages.

    The backward all-gathers the pieces' gradients into x's gradient, the same on
    every rank. x must have the same shape on every rank.
    """
    return _scattering("split_to_group", x, dim, group, check, reduce=False)


def gather_from_group(
    x: Tensor,
    dim: int,
    group: Group = None,
    check: bool = True,
    *,
    sizes: Sequence[int] | None = None,
) -> Tensor:
    """Every rank's x concatenated along `dim`, in rank order: a replicated result.

    The backward keeps this rank's slice of the gradient: what follows is replicated,
    so no sum is needed. Pieces may differ in size along `dim`; all other dims and
    the dtype must match across ranks. `sizes`: every rank's size along `dim`, the
    same list on every rank, where the logical shape gives it (module docstring);
    without it a checked call reads them from its agreement, an unchecked one
    exchanges them.
    """
    return _gathering("gather_from_group", x, dim, group, check, False, sizes)


def all_gather_along(
    x: Tensor,
    dim: int,
    group: Group = None,
    check: bool = True,
    *,
    sizes: Sequence[int] | None = None,
) -> Tensor:
    """Every rank's x concatenated along `dim`; the backward reduce-scatters (sums).

    Sequence parallelism's gather: each rank then uses the whole sequence differently,
    so the gradient of each piece is summed over ranks and handed to its owner. Sizes
    along `dim` may differ, and `sizes` gives them, as in gather_from_group.
    """
    return _gathering("all_gather_along", x, dim, group, check, True, sizes)


def _gathering(
    name: str,
    x: Tensor,
    dim: int,
    group: Group,
    check: bool,
    reduce: bool,
    sizes: Sequence[int] | None,
) -> Tensor:
    """Validate, agree on everything but the size along `dim` (the agreement brings
    every rank's size), then gather with the sizes given, agreed or exchanged."""
    g = members(group, name)

    def valid() -> int:
        d = _dim(x, dim, name)
        _given(sizes, x, d, g, name)
        return d

    d, agreed = agree_lengths(
        name, x, dim, group, validate=valid, key_name="dim", check=check
    )
    if g.size == 1:
        return x
    known = _agreed_sizes(_given(sizes, x, d, g, name), agreed, name)
    return _Gather.apply(x, d, _sizes(x, d, g, known), g, reduce)


def _agreed_sizes(
    given: list[int] | None, agreed: list[int] | None, name: str
) -> list[int] | None:
    """The sizes given, checked against the agreement's where both exist (the same
    on every rank, so every rank raises alike); else whichever exists."""
    if given is not None and agreed is not None and given != agreed:
        raise ValueError(f"{name}: sizes={given}, but the ranks hold {agreed}")
    return given if given is not None else agreed


def reduce_scatter_along(
    x: Tensor, dim: int, group: Group = None, check: bool = True
) -> Tensor:
    """This rank's tensor_split piece along `dim` of the sum of x over ranks.

    Sequence parallelism's scatter, in place of reduce_from_group: half the bytes of
    an all-reduce. The backward all-gathers. x must have the same shape on every rank.
    """
    return _scattering("reduce_scatter_along", x, dim, group, check, reduce=True)


def _scattering(
    name: str, x: Tensor, dim: int, group: Group, check: bool, reduce: bool
) -> Tensor:
    """Validate, agree on x's whole shape (the same on every rank), apply."""
    g = members(group, name)
    valid_dim = lambda: _dim(x, dim, name)  # noqa: E731
    d = agree(name, x, group, validate=valid_dim, key_name="dim", check=check)
    return x if g.size == 1 else _Scatter.apply(x, d, g, reduce)


def all_to_all_along(
    x: Tensor,
    split_dim: int,
    cat_dim: int,
    group: Group = None,
    check: bool = True,
    *,
    sizes: Sequence[int] | None = None,
) -> Tensor:
    """Split x along `split_dim` across ranks and concatenate what arrives on `cat_dim`.

    Rank j receives piece j (tensor_split sizes) of every rank's x and concatenates
    them in rank order: e.g. (heads, seq/N) -> (heads/N, seq), as in DeepSpeed
    Ulysses. The backward is the reverse all_to_all. Sizes along `cat_dim` may differ
    across ranks (`sizes` gives them, as in gather_from_group); all other dims must
    match. The two dims differ.
    """
    name = "all_to_all_along"
    g = members(group, name)

    def both_dims() -> int:
        s, c = _dim(x, split_dim, name, "split_dim"), _dim(x, cat_dim, name, "cat_dim")
        if s == c:
            raise ValueError(f"{name}: split_dim and cat_dim must differ, both are {s}")
        _given(sizes, x, c, g, name)
        return 100 * s + c

    shown = "100*split_dim+cat_dim"
    key, agreed = agree_lengths(
        name, x, cat_dim, group, validate=both_dims, key_name=shown, check=check
    )
    if g.size == 1:
        return x
    dims = divmod(key, 100)  # (split_dim, cat_dim)
    known = _agreed_sizes(_given(sizes, x, dims[1], g, name), agreed, name)
    return _AllToAll.apply(x, dims, _sizes(x, dims[1], g, known), g)
