"""What tensor parallelism sends, by formula and by ledger, in the book's one
convention: bytes one rank puts on the wire, for the ring algorithm (comm.ledger).

Each sub-layer (attention or MLP) costs, per step, an all_reduce of its (B, T, C)
activation of S bytes in forward (g) and one in backward (f): 2 x 2(n-1)/n x S on
a ring of n ranks. Sequence parallelism replaces each all_reduce by an all_gather
and a reduce_scatter, (n-1)/n x S each: the same bytes.
"""

from __future__ import annotations

from torch import Tensor, nn

from distcourse.comm.ledger import Ledger


def sublayer_wire_bytes(activation_bytes: int, n: int) -> int:
    """Wire bytes per rank, per sub-layer and step: two ring all_reduces of S bytes
    (or, with sequence parallelism, two all_gathers and two reduce_scatters)."""
    if n < 1 or activation_bytes < 0:
        raise ValueError(
            f"need n >= 1 and S >= 0 bytes, got n={n}, S={activation_bytes}"
        )
    return 2 * (2 * (n - 1) * activation_bytes // n)


def step_ledger(module: nn.Module, x: Tensor) -> Ledger:
    """A ledger of one forward and backward of sum(module(x)) on this rank.

    x gets a gradient, as inside a model, so f's backward all_reduce runs too.
    """
    x = x.detach().clone().requires_grad_()
    with Ledger() as ledger:
        module(x).sum().backward()
    return ledger
