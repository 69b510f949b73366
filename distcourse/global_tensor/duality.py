"""Every forward conversion has a backward one: measured, not listed (chapter 7).

A conversion `y = x.to_global(sbp=dst, grad_sbp=g)` is the identity on the logical
tensor, so its backward is the identity too: the gradient dy, arriving with some
signature, is boxed into `g` (by default x's signature with P replaced by B).
What that boxing costs depends on how dy arrives: a broadcast output's gradient
arrives P in general (`arrives_as`: each rank used all of it its own way), B when
every rank computed all of it.

`conversion_cost` runs one conversion forward and backward on live ranks, names
the collectives from the debug log (what ran) and counts this rank's bytes with
comm.ledger (what moved); `conversion_table` does it for many and formats the
rows. `copy_to_parallel` and `reduce_from_parallel` are Megatron's f and g, each
one global-tensor line.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from distcourse.comm.ledger import Ledger
from distcourse.global_tensor import layouts
from distcourse.global_tensor.debug import DebugLog, debug
from distcourse.global_tensor.placement import Placement
from distcourse.global_tensor.sbp import (
    Broadcast,
    PartialSum,
    Signature,
    describe,
    local_piece,
    signature,
)
from distcourse.global_tensor.tensor import GlobalTensor, default_grad_sbp, rebox


@dataclass(frozen=True)
class Cost:
    """One conversion measured on this rank: what ran and the bytes it sent."""

    src: str  # x's signature
    dst: str  # y's signature
    arrives: str  # the signature dy arrived with
    grad: str  # the signature x's gradient left with (grad_sbp)
    forward: str  # the collectives that ran forward, from the debug log
    backward: str  # and backward
    forward_bytes: int  # this rank's bytes, from the ledger
    backward_bytes: int
    correct: bool  # x's gradient equals dy (a conversion is the identity)

    def row(self, width: int = 4, name: int = 14) -> str:
        """One line of the chapter's table (`width` for a signature, `name` for
        the collectives)."""
        ok = "PASS" if self.correct else "FAIL"
        fwd = f"{self.src:>{width}} -> {self.dst:<{width}} {self.forward:<{name}}"
        bwd = f"{self.arrives:>{width}} -> {self.grad:<{width}} {self.backward:<{name}}"
        return (
            f"{fwd} {self.forward_bytes:>4} B | {bwd} {self.backward_bytes:>4} B"
            f" | gradient {ok}"
        )


def arrives_as(sig: Signature) -> Signature:
    """How the gradient of a tensor under `sig` arrives in general, per mesh
    dimension: S(i) as S(i); B as P (each rank's use of the whole tensor adds a
    contribution); P as B (every piece of a sum gets the whole gradient)."""
    flip = {Broadcast(): PartialSum(), PartialSum(): Broadcast()}
    return tuple(flip.get(s, s) for s in sig)


def collectives(log: DebugLog) -> str:
    """The one-mesh-dimension conversions a debug log saw, joined ("nothing")."""
    ran = [ln.split("  ")[-1] for ln in log.boxing() if ln.startswith("mesh dim")]
    return " + ".join(ran) or "nothing"


def _values(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Small exact values (multiples of 1/4), the same on every rank and machine."""
    n = torch.Size(shape).numel()
    return ((torch.arange(n) * (2 * seed + 3)) % 11 - 5).reshape(shape) / 4.0


def placed(whole: torch.Tensor, pl: Placement, sig: Any) -> GlobalTensor:
    """`whole` (the same on every rank) under `sig`, with no messages: each rank
    keeps its piece (P: coordinate 0 keeps the value, the others zeros)."""
    sig = signature(sig, pl.ndim, whole.dim(), "placed")
    coord = pl.require_member("placed")
    piece = local_piece(whole, sig, pl.hierarchy, coord).to(pl.device)
    return GlobalTensor(piece, pl, sig, tuple(whole.shape))


def conversion_cost(
    pl: Placement,
    shape: tuple[int, ...],
    src: Any,
    dst: Any,
    *,
    grad_sbp: Any = None,
    arrives: Any = None,
) -> Cost:
    """Run x.to_global(sbp=dst, grad_sbp=grad_sbp) forward and backward on every
    rank of `pl` (a collective): x has signature `src`, dy arrives as `arrives`
    (default: arrives_as(dst), B's gradient as P)."""
    shape = tuple(shape)
    src_sig = signature(src, pl.ndim, len(shape), "src")
    dst_sig = signature(dst, pl.ndim, len(shape), "dst")
    nd = len(shape)
    come = (
        arrives_as(dst_sig)
        if arrives is None
        else signature(arrives, pl.ndim, nd, "dy")
    )
    x = placed(_values(shape, 0), pl, src_sig).requires_grad_()
    x = x.view_as(x)  # a non-leaf: its gradient is what the conversion returns
    with debug() as flog, Ledger() as fl:
        y = x.to_global(sbp=dst_sig, grad_sbp=grad_sbp)
    dy = placed(_values(shape, 1), pl, come)
    with debug() as blog, Ledger() as bl:
        (dx,) = torch.autograd.grad(y, x, dy)
    whole = rebox(dx, tuple(Broadcast() for _ in range(pl.ndim)))
    want = (
        default_grad_sbp(src_sig)
        if grad_sbp is None
        else signature(grad_sbp, pl.ndim, nd, "g")
    )
    got = whole.local_tensor  # on the placement's device; _values is on the host
    ok = dx.sbp == want and torch.equal(got, _values(shape, 1).to(got.device))
    return Cost(
        describe(src_sig),
        describe(dst_sig),
        describe(come),
        describe(dx.sbp),
        collectives(flog),
        collectives(blog),
        fl.bytes_sent(),
        bl.bytes_sent(),
        ok,
    )


def conversion_table(
    pl: Placement, shape: tuple[int, ...], cases: Iterable[tuple]
) -> list[Cost]:
    """conversion_cost for each case (src, dst) or (src, dst, arrives, grad_sbp);
    every rank of `pl` calls it with the same cases."""
    out = []
    for case in cases:
        src, dst, come, grad = (*case, None, None)[:4]
        out.append(conversion_cost(pl, shape, src, dst, grad_sbp=grad, arrives=come))
    return out


def gradient_signatures(module: nn.Module) -> list[tuple[str, str, str]]:
    """(name, the parameter's signature, its gradient's) for each global parameter
    with a gradient: after backward they should be equal, P boxed to B."""
    every = layouts.signatures(module).items()  # "-" for no global gradient
    return [(name, sig, grad) for name, (sig, grad) in every if grad != "-"]


def copy_to_parallel(x: GlobalTensor) -> GlobalTensor:
    """Megatron's f: the identity forward; backward, the gradient (P when the next
    op splits its weight) is all-reduced into B (P -> B)."""
    return x.to_global(sbp=x.sbp, grad_sbp=default_grad_sbp(x.sbp))


def reduce_from_parallel(y: GlobalTensor) -> GlobalTensor:
    """Megatron's g: a partial sum all-reduced forward (P -> B); backward the
    identity (the gradient arrives B and stays B)."""
    return y.to_global(sbp=default_grad_sbp(y.sbp), grad_sbp=default_grad_sbp(y.sbp))
