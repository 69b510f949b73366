"""Making global tensors, and bad input: factories give one process's values under
every signature; gt.to_global reads pieces; every mistake raises a clear error on
every rank before any collective, and the ranks can go on afterwards (no hang).
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.distributed as dist
from helpers import refused_on

import distcourse.global_tensor as gt
from distcourse import checks
from distcourse.launch import spawn

KINDS = [gt.sbp.split(0), gt.sbp.split(1), gt.sbp.broadcast, gt.sbp.partial_sum]


def _factories(ranks: list) -> list[str]:
    p = gt.placement("cpu", ranks=ranks)
    bad = []
    for sig in itertools.product(KINDS, repeat=p.ndim):
        torch.manual_seed(3)
        x = gt.randn(5, 3, placement=p, sbp=sig)
        torch.manual_seed(3)
        if not torch.equal(x.full_tensor(), torch.randn(5, 3)) or x.shape != (5, 3):
            bad.append(f"randn {sig}")
        for made, want in [
            (gt.zeros(5, 3, placement=p, sbp=sig), torch.zeros(5, 3)),
            (gt.ones((5, 3), placement=p, sbp=sig), torch.ones(5, 3)),
            (gt.full((5, 3), 2.5, placement=p, sbp=sig), torch.full((5, 3), 2.5)),
        ]:
            if not torch.equal(made.full_tensor(), want):
                bad.append(f"factory {sig}")
    return bad


@pytest.mark.parametrize("world, ranks", [(2, [0, 1]), (4, [[0, 1], [2, 3]])])
def test_factories_give_one_process_values(world: int, ranks: list) -> None:
    assert spawn(_factories, world, ranks, timeout=20) == [[]] * world


def _from_local() -> list:
    me = dist.get_rank()
    p = gt.placement("cpu", ranks=[0, 1])
    piece = torch.full((3 - me, 2), float(me))  # tensor_split(5) gives 3 and 2
    s = gt.to_global(piece, p, gt.sbp.split(0))
    b = gt.to_global(torch.full((2,), float(me)), p, gt.sbp.broadcast)
    q = gt.to_global(torch.full((2,), float(me + 1)), p, gt.sbp.partial_sum)
    return [
        tuple(s.shape),
        s.full_tensor()[:, 0].tolist(),
        b.full_tensor().tolist(),
        q.full_tensor().tolist(),
        str(s.sbp),
        str(s.placement),
    ]


def test_to_global_reads_this_ranks_piece() -> None:
    got = spawn(_from_local, 2, timeout=20)
    want = [
        (5, 2),
        [0.0, 0.0, 0.0, 1.0, 1.0],
        [0.0, 0.0],
        [3.0, 3.0],
        "(S(0),)",
        'placement(type="cpu", ranks=[0, 1])',
    ]
    assert got == [want, want]


def _errors() -> list[str]:
    """Each mistake on every rank, then one collective that must still work."""
    me = dist.get_rank()
    p = gt.placement("cpu", ranks=[0, 1])
    q = gt.placement("cpu", ranks=[[0], [1]])  # the same ranks as a 2x1 mesh
    x = gt.randn(4, 4, placement=p, sbp=gt.sbp.split(0))
    y = gt.randn(4, 4, placement=q, sbp=(gt.sbp.split(0), gt.sbp.broadcast))
    cases = {
        "different placements": lambda: x + y,
        "split dim out of range": lambda: gt.randn(
            4, 4, placement=p, sbp=gt.sbp.split(2)
        ),
        "rank not in the world": lambda: gt.placement("cpu", ranks=[0, 5]),
        "ranks not increasing": lambda: gt.placement("cpu", ranks=[1, 0]),
        "unknown sbp": lambda: x.to_global(sbp="S(0)"),
        "2-D signature on 1-D": lambda: x.to_global(sbp=(gt.sbp.broadcast,) * 2),
        "plain non-scalar tensor": lambda: x + torch.ones(4, 4),
        "pieces not tensor_split": lambda: gt.to_global(
            torch.ones(3 if me == 0 else 1, 4), p, gt.sbp.split(0)
        ),
        "random op without a rule": lambda: torch.nn.functional.dropout(x),
    }
    got = checks.outcomes(cases, (ValueError, NotImplementedError), with_type=True)
    one = gt.placement("cpu", ranks=[0])
    try:
        gt.zeros(2, placement=one, sbp=gt.sbp.broadcast)
        got.append("rank not in placement: fine" if me == 0 else "no error")
    except ValueError as err:
        got.append(f"rank not in placement: {err}")
    ok = x + torch.tensor(2.0) + 2  # scalars mix
    got.append(str(ok.full_tensor().shape))  # a collective: no rank hangs
    return got


def test_bad_input_raises_on_every_rank_before_any_collective() -> None:
    got = refused_on(
        _errors,
        2,
        "different placements",
        "split(2) is out of range",
        "are not ranks of this world",
        "must increase",
        "unknown SBP 'S(0)'",
        "has 2 entries but the placement is 1-D",
        "mixes a global tensor with a plain tensor of shape [4, 4]",
        "do not make one tensor under S(0)",
        "has no SBP rule",
    )
    for lines in got:
        assert lines[-1] == "torch.Size([4, 4])"
    assert got[0][-2] == "rank not in placement: fine"
    assert "rank 1 is not in placement ranks [0]" in got[1][-2]
