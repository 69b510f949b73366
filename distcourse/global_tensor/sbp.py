"""SBP: how one mesh dimension holds a logical tensor (OneFlow's split / broadcast /
partial_sum), and the arithmetic of pieces.

On one mesh dimension of n ranks a tensor is

    split(i)     each rank holds one piece along tensor dim i   S(i)
    broadcast    each rank holds the whole tensor               B
    partial_sum  each rank holds a tensor of the whole shape;   P
                 the logical tensor is their sum

A signature is one SBP per mesh dimension, applied outermost first: on a 2-D
placement, (S(0), S(0)) splits dim 0 across mesh rows, then each row's piece across
its columns (DTensor nests the same way). Uneven sizes follow torch.tensor_split:
the first `size % n` ranks hold one more element.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


class SBP:
    """Base of the three kinds; instances are immutable and compare by value."""


@dataclass(frozen=True)
class Split(SBP):
    """S(dim): rank c of the mesh dimension holds tensor_split piece c along dim."""

    dim: int

    def __repr__(self) -> str:
        return f"S({self.dim})"


@dataclass(frozen=True)
class Broadcast(SBP):
    """B: every rank holds the whole tensor."""

    def __repr__(self) -> str:
        return "B"


@dataclass(frozen=True)
class PartialSum(SBP):
    """P: every rank holds a whole-shaped tensor; the logical one is their sum."""

    def __repr__(self) -> str:
        return "P"


broadcast = Broadcast()
partial_sum = PartialSum()
Signature = tuple[SBP, ...]


def split(dim: int) -> Split:
    """S(dim), as OneFlow's `flow.sbp.split(dim)`; dim is checked against a tensor
    when the signature is used."""
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise ValueError(f"split(dim): dim must be an int, got {dim!r}")
    return Split(dim)


def signature(sbp: object, mesh_ndim: int, tensor_ndim: int, what: str) -> Signature:
    """`sbp` (one SBP, or one per mesh dimension) as a checked tuple.

    A single SBP is accepted on a 1-D placement only; split dims are made
    non-negative and checked against `tensor_ndim`. Raises ValueError naming `what`.
    """
    items = tuple(sbp) if isinstance(sbp, list | tuple) else (sbp,)
    if len(items) != mesh_ndim:
        raise ValueError(
            f"{what}: signature {items!r} has {len(items)} entries but the "
            f"placement is {mesh_ndim}-D: give one SBP per mesh dimension"
        )
    out = []
    for s in items:
        if not isinstance(s, SBP) or type(s) is SBP:
            raise ValueError(
                f"{what}: unknown SBP {s!r}; use gt.sbp.split(i), gt.sbp.broadcast "
                "or gt.sbp.partial_sum"
            )
        if isinstance(s, Split):
            if not -tensor_ndim <= s.dim < max(tensor_ndim, 1) or tensor_ndim == 0:
                raise ValueError(
                    f"{what}: split({s.dim}) is out of range for a "
                    f"{tensor_ndim}-d tensor"
                )
            s = Split(s.dim % tensor_ndim)
        out.append(s)
    return tuple(out)


def is_split(s: SBP, dim: int | None = None) -> bool:
    """True if s is a split (along `dim`, if given)."""
    return isinstance(s, Split) and (dim is None or s.dim == dim)


def piece(size: int, n: int, c: int) -> tuple[int, int]:
    """(start, length) of piece c of `size` split n ways, as torch.tensor_split."""
    q, r = divmod(size, n)
    return c * q + min(c, r), q + (c < r)


def local_shape(
    shape: Sequence[int], sig: Signature, mesh: Sequence[int], coord: Sequence[int]
) -> tuple[int, ...]:
    """Shape of the piece at `coord` of a tensor of logical `shape` under `sig`."""
    out = list(shape)
    for s, n, c in zip(sig, mesh, coord, strict=True):
        if isinstance(s, Split):
            out[s.dim] = piece(out[s.dim], n, c)[1]
    return tuple(out)


def check_grad_fits(
    shape: Sequence[int],
    sig: Signature,
    grad: Signature,
    mesh: Sequence[int],
    what: str,
) -> None:
    """ValueError unless a gradient boxed into `grad` gives every coordinate of the
    mesh a piece of the same shape as `sig` does (the local tensor's gradient must
    have the local tensor's shape). Decided from shapes alone, for every coordinate,
    so that every rank raises alike, before any collective, even where only some
    pieces differ (an uneven split)."""
    for coord in itertools.product(*(range(n) for n in mesh)):
        got = local_shape(shape, grad, mesh, coord)
        want = local_shape(shape, sig, mesh, coord)
        if got != want:
            raise ValueError(
                f"{what}: grad_sbp {describe(grad)} does not fit a piece of "
                f"{describe(sig)} (shape {list(shape)}; at mesh coordinate "
                f"{list(coord)} a piece {list(got)}, not {list(want)})"
            )


def local_piece(
    full: Tensor, sig: Signature, mesh: Sequence[int], coord: Sequence[int]
) -> Tensor:
    """The piece of `full` that rank `coord` holds under `sig` (a new tensor).

    Splits slice; a partial sum keeps the value at coordinate 0 and zeros elsewhere,
    so the sum over the mesh dimension is the value.
    """
    out = full
    for s, n, c in zip(sig, mesh, coord, strict=True):
        if isinstance(s, Split):
            start, length = piece(out.size(s.dim), n, c)
            out = out.narrow(s.dim, start, length)
        elif isinstance(s, PartialSum) and c != 0:
            out = torch.zeros_like(out)
    return out.clone(memory_format=torch.contiguous_format)


def describe(sig: Signature) -> str:
    """A signature as text: "S(0)" on 1-D, "(S(0), B)" on 2-D."""
    return repr(sig[0]) if len(sig) == 1 else "(" + ", ".join(map(repr, sig)) + ")"


def numel(shape: Sequence[int]) -> int:
    """Number of elements of a shape (1 for a scalar)."""
    return math.prod(shape)
