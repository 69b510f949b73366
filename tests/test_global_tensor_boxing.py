"""distcourse.global_tensor.boxing on real gloo ranks: every conversion between two
signatures keeps the logical tensor (full_tensor equals it), leaves each rank the
piece tensor_split gives, moves the bytes the formula says, and has a backward.

Values are small integers in float64, so sums are exact in any order. Shapes are
uneven on purpose (5 rows on 2 and 4 ranks; 3 columns on 4 ranks: a piece of 0).
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.distributed as dist
from torch import Tensor

import distcourse.global_tensor as gt
from distcourse.comm.ledger import Ledger
from distcourse.global_tensor.boxing import plan, steps, transfer_bytes
from distcourse.global_tensor.sbp import local_piece, local_shape
from distcourse.launch import spawn

SHAPE = (5, 3)
KINDS = [gt.sbp.split(0), gt.sbp.split(1), gt.sbp.broadcast, gt.sbp.partial_sum]


def _ints(shape: tuple[int, ...], seed: int) -> Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(-4, 5, shape, generator=gen).to(torch.float64)


def _global(p: gt.Placement, sig: tuple) -> tuple[gt.GlobalTensor, Tensor]:
    """A global tensor under sig and its logical value; partial sums are made of
    different non-zero pieces on every rank."""
    whole = _ints(SHAPE, 0)
    mine = local_piece(whole, sig, p.hierarchy, p.coord)
    parts = [i for i, s in enumerate(sig) if s == gt.sbp.partial_sum]
    combos = list(itertools.product(*[range(p.hierarchy[i]) for i in parts]))
    noise = {c: _ints(mine.shape, 1 + k) for k, c in enumerate(combos)}
    here = tuple(p.coord[i] for i in parts)
    if here != combos[0]:  # every P dim's pieces differ; their sum stays whole
        mine = mine + noise[here]
    else:
        mine = mine - sum(noise[c] for c in combos[1:])
    return gt.to_global(mine, p, sig), whole


def _formula(p: gt.Placement, src: tuple, dst: tuple) -> int:
    """Bytes rank 0 sends: per step, the formula for the tensor its group holds."""
    total = 0
    for k, before, after in steps(src, dst):
        held = before[:k] + (gt.sbp.broadcast,) + before[k + 1 :]
        shape = local_shape(SHAPE, held, p.hierarchy, p.coord)
        total += transfer_bytes(before[k], after[k], shape, p.hierarchy[k], 8)
    return total


def _all_pairs(ranks: list) -> list[str]:
    p = gt.placement("cpu", ranks=ranks)
    sigs = list(itertools.product(KINDS, repeat=p.ndim))
    bad = []
    for src, dst in itertools.product(sigs, sigs):
        x, whole = _global(p, src)
        assert torch.equal(x.full_tensor(), whole), f"{src}: not the tensor"
        with Ledger() as ledger:
            y = x.to_global(sbp=dst)
        if y.sbp != dst or not torch.equal(y.full_tensor(), whole):
            bad.append(f"{src} -> {dst}: value")
        elif dst != (gt.sbp.partial_sum,) * p.ndim and not any(
            s == gt.sbp.partial_sum for s in dst
        ):
            want = local_piece(whole, dst, p.hierarchy, p.coord)
            if not torch.equal(y.local_tensor, want):
                bad.append(f"{src} -> {dst}: piece")
        if dist.get_rank() == 0:
            want = _formula(p, src, dst)
            if ledger.bytes_sent() != want:
                bad.append(f"{src} -> {dst}: {ledger.bytes_sent()} bytes, want {want}")
    return bad


@pytest.mark.parametrize(
    "world, ranks", [(2, [0, 1]), (4, [0, 1, 2, 3]), (4, [[0, 1], [2, 3]])]
)
def test_every_conversion_keeps_the_tensor(world: int, ranks: list) -> None:
    assert spawn(_all_pairs, world, ranks, timeout=20) == [[]] * world


def _backward(ranks: list) -> list[str]:
    """Gradient through each conversion: d/dx sum(y * c) is c, under any signature."""
    p = gt.placement("cpu", ranks=ranks)
    c = gt.to_global(_ints(SHAPE, 7), p, (gt.sbp.broadcast,) * p.ndim)
    bad = []
    for src, dst in itertools.product(KINDS, KINDS):
        x, _ = _global(p, (src,))
        x = x.detach().requires_grad_()
        (x.to_global(sbp=dst) * c).sum().backward()
        if not torch.equal(x.grad.full_tensor(), c.full_tensor()):
            bad.append(f"{src} -> {dst}: gradient")
    return bad


def test_every_conversion_has_a_backward() -> None:
    assert spawn(_backward, 2, [0, 1], timeout=20) == [[], []]


def test_nested_splits_convert_through_broadcast() -> None:
    s0, b = gt.sbp.split(0), gt.sbp.broadcast
    assert plan((b, s0), (s0, s0)) == ([0, 1], False)  # mesh dim 1 re-splits
    assert plan((s0, b), (s0, s0)) == ([1], True)  # innermost: a plain slice
    assert plan((s0, gt.sbp.split(1)), (gt.sbp.split(1), s0))[1] is False


def _subset() -> list[str]:
    """A placement of ranks 0 and 2 of 4: the others take no part."""
    p = gt.placement("cpu", ranks=[0, 2])
    if p.coord is None:
        return []
    x = gt.to_global(_ints((3, 2), dist.get_rank()), p, gt.sbp.split(0))
    whole = torch.cat([_ints((3, 2), 0), _ints((3, 2), 2)])
    return [] if torch.equal(x.full_tensor(), whole) else ["subset"]


def test_a_placement_over_some_ranks() -> None:
    assert spawn(_subset, 4, timeout=20) == [[]] * 4


def test_even_pieces_cost_the_ring_formula_of_their_collective() -> None:
    """An 8 x 8 float32 tensor (T = 256 bytes) on 4 ranks: reduce_scatter and the
    all_gather both (n-1)T/n, all_reduce the two together, all_to_all (n-1)/n of a
    rank's piece; the pieces' lengths follow from the logical shape, so no size
    travels."""
    s0, s1 = gt.sbp.split(0), gt.sbp.split(1)
    b, p = gt.sbp.broadcast, gt.sbp.partial_sum
    n, t = 4, 256

    def cost(src: object, dst: object) -> int:
        return transfer_bytes(src, dst, (8, 8), n, 4)

    assert cost(p, s0) == cost(p, s1) == (n - 1) * t // n == 192
    assert cost(s0, b) == cost(s1, b) == 192
    assert cost(p, b) == 2 * (n - 1) * t // n == cost(p, s0) + cost(s0, b)
    assert cost(s0, s1) == (n - 1) * t // n**2 == 48
    assert [cost(b, s0), cost(b, p), cost(s0, p)] == [0, 0, 0]
