"""distcourse.global_tensor.move on 4 real gloo ranks: moving to another placement
(1-D and 2-D) keeps the logical tensor, the gradient moves back as one process
computes it, the Ledger sees the bytes of the formula (and of hand-counted
numbers), and bad input raises before any message.

Values are small integers in float64 (exact); 5 rows do not split evenly.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from helpers import assert_refused
from torch import Tensor

import distcourse.global_tensor as gt
from distcourse import checks
from distcourse.comm.ledger import Ledger
from distcourse.global_tensor.move import absent, move_bytes
from distcourse.global_tensor.sbp import local_piece
from distcourse.global_tensor.tensor import GlobalTensor
from distcourse.launch import spawn

SHAPE = (5, 3)
S0, S1, B = gt.sbp.split(0), gt.sbp.split(1), gt.sbp.broadcast
CASES = [
    ([0, 1], (S0,), [2, 3], (S0,)),
    ([0, 1], (B,), [0, 1, 2, 3], (S1,)),
    ([0, 1, 2, 3], (S0,), [0, 1], (B,)),
    ([2, 3], (S1,), [1, 2], (S0,)),
    ([0, 1], (S0,), [[0, 1], [2, 3]], (S1, B)),
    ([[0, 1], [2, 3]], (S0, S1), [1, 2], (S1,)),
]


def _ints(seed: int) -> Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(-4, 5, SHAPE, generator=gen).to(torch.float64)


def _held(p: gt.Placement, sig: tuple, whole: Tensor) -> GlobalTensor:
    """A leaf global tensor on p: its piece here, or an empty one outside p."""
    if p.coord is None:
        return absent(SHAPE, p, sig, torch.float64, requires_grad=True)
    mine = local_piece(whole, sig, p.hierarchy, p.coord)
    return GlobalTensor(mine, p, sig, SHAPE, requires_grad=True)


def _case(src: list, a: tuple, dst: list, b: tuple) -> tuple[str, int, int]:
    p, q = gt.placement("cpu", ranks=src), gt.placement("cpu", ranks=dst)
    me, whole, weight = dist.get_rank(), _ints(0), _ints(1)
    if me not in p.grid.flatten().tolist() + q.grid.flatten().tolist():
        return ("idle", 0, 0)
    x = _held(p, a, whole)
    with Ledger() as ledger:
        y = x.to_global(placement=q, sbp=b)
    sent = ledger.bytes_sent()
    want = move_bytes(SHAPE, 8, p, a, q, b, me)
    if q.coord is None:  # outside q: hand the empty gradient back (all must call)
        y.backward(absent(SHAPE, q, b, torch.float64))
        value = f"outside q, local {list(y.to_local().shape)}"
    else:  # one process: loss = (y * weight).sum(), so x.grad is weight
        ok = torch.equal(y.full_tensor(), whole)
        value = f"{y.sbp} {list(y.to_local().shape)} {ok}"
        w = local_piece(weight, b, q.hierarchy, q.coord)
        (y.to_local() * w).sum().backward()
    if p.coord is not None:
        value += f" grad {x.grad.sbp} {torch.equal(x.grad.full_tensor(), weight)}"
    return value, sent, want


def _all() -> list:
    return [_case(*case) for case in CASES]


def test_move_values_gradients_and_bytes() -> None:
    got = spawn(_all, 4, timeout=20)
    for k, (src, _, dst, b) in enumerate(CASES):
        for rank in range(4):
            value, sent, want = got[rank][k]
            assert sent == want, (k, rank, sent, want)
            in_p = rank in torch.tensor(src).flatten().tolist()
            if rank in torch.tensor(dst).flatten().tolist():
                assert value.startswith(str(b)) and " True" in value, value
            elif in_p:  # an empty piece, as OneFlow's to_local gives
                assert value.startswith("outside q, local [0]"), value
            else:
                assert value == "idle", value
            if in_p:
                assert value.endswith(" True") and "grad" in value, (k, rank, value)
    # hand-counted, case 0 ([0, 1] S(0) -> [2, 3] S(0), 5 x 3 float64): ranks 0 and
    # 1 all_gather (3 rows * 24 bytes, the longest piece; the lengths follow from
    # the shape), then send a header (80) and rows 0-2 (72) to rank 2, rows 3-4
    # (48) to rank 3; ranks 2 and 3 send one ack (80)
    assert [got[r][0][1] for r in range(4)] == [72 + 80 + 72, 72 + 80 + 48, 80, 80]


def _errors() -> list[str]:
    me = dist.get_rank()
    p, q = gt.placement("cpu", ranks=[0, 1]), gt.placement("cpu", ranks=[2, 3])
    other = gt.placement("cuda", ranks=[2, 3])
    three = gt.placement("cpu", ranks=[0, 1, 2])
    x = _held(p, (S0,), _ints(0))
    cases = {
        "device": lambda: x.to_global(placement=other, sbp=S0),
        "sbp": lambda: x.to_global(placement=q, sbp="S(0)"),
        "type": lambda: x.to_global(placement=[2, 3], sbp=S0),
    }
    if me == 3:  # in neither [0, 1] nor [0, 1, 2]
        cases["outsider"] = lambda: x.to_global(placement=three)
    return checks.outcomes(cases)


def test_bad_input_raises_before_any_message() -> None:
    got = spawn(_errors, 4, timeout=10)
    for rank, lines in enumerate(got):
        words = [
            "device types differ ('cpu' vs 'cuda')",
            "unknown SBP 'S(0)'",
            "must be a Placement",
        ]
        assert_refused(lines, *words, *(["is in neither"] if rank == 3 else []))
