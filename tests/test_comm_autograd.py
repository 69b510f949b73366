"""distcourse.comm.autograd on real gloo ranks: each forward and gradient equals one
process running the same program on the whole tensors.

Values are small integers in float64, so every sum is exact in any order and results
compare with torch.equal.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
import torch.distributed as dist
from spawned import assert_says
from torch import Tensor

from distcourse.comm import autograd as ag
from distcourse.comm.ledger import Ledger
from distcourse.launch import spawn
from distcourse.runtime import RankError

SIZES = (2, 0, 3, 1)  # rank r's length along the gathered dim: any sizes, even 0


def _ints(shape: tuple[int, ...], seed: int) -> Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(-4, 5, shape, generator=gen).to(torch.float64)


def _same(got: Tensor | None, want: Tensor | None, what: str) -> None:
    got = torch.zeros_like(want) if got is None else got  # no grad: a zero grad
    want = torch.zeros_like(got) if want is None else want
    assert got.shape == want.shape and torch.equal(got, want), f"{what}: {got} {want}"


def _a2a(xs: list[Tensor], n: int, split: int, cat: int) -> list[Tensor]:
    return [torch.cat([x.tensor_split(n, split)[r] for x in xs], cat) for r in range(n)]


@dataclass(frozen=True)
class Case:
    """One op on every rank, and the same program in one process on whole tensors.

    `ref` maps the inputs by rank to the outputs by rank. A replicated input is one
    tensor that every rank holds; a replicated output is one result, the same on
    every rank, counted once in the loss. Otherwise the loss sums every rank's.
    """

    name: str
    fn: Callable[[Tensor], Tensor]
    ref: Callable[[list[Tensor], int], list[Tensor]]
    shape: Callable[[int, int], tuple[int, ...]]  # (rank, n) -> input shape
    replicated_in: bool = False
    replicated_out: bool = False


def _both_gathers_along_0() -> list[Case]:
    """gather (one replicated result) and all_gather along dim 0: the same values."""
    concat = lambda xs, n: [torch.cat(xs, 0)] * n  # noqa: E731
    rows = lambda s, n: (SIZES[s], 3)  # noqa: E731
    gather = lambda x: ag.gather_from_group(x, 0)  # noqa: E731
    everywhere = lambda x: ag.all_gather_along(x, 0)  # noqa: E731
    return [
        Case("gather 0", gather, concat, rows, replicated_out=True),
        Case("all_gather 0", everywhere, concat, rows),
    ]


CASES = [
    Case(
        "copy",
        ag.copy_to_group,
        lambda xs, n: xs,
        lambda s, n: (3, 4),
        replicated_in=True,
    ),
    Case(
        "reduce",
        ag.reduce_from_group,
        lambda xs, n: [sum(xs)] * n,
        lambda s, n: (3, 4),
        replicated_out=True,
    ),
    Case(
        "split 0",
        lambda x: ag.split_to_group(x, 0),
        lambda xs, n: list(xs[0].tensor_split(n, 0)),
        lambda s, n: (7, 3),
        replicated_in=True,
    ),
    Case(
        "split -1 of a transpose",
        lambda x: ag.split_to_group(x.t(), -1),
        lambda xs, n: list(xs[0].t().tensor_split(n, -1)),
        lambda s, n: (9, 2),
        replicated_in=True,
    ),
    *_both_gathers_along_0(),
    Case(
        "gather 1",
        lambda x: ag.gather_from_group(x, 1),
        lambda xs, n: [torch.cat(xs, 1)] * n,
        lambda s, n: (2, ag.split_sizes(7, n)[s], 2),
        replicated_out=True,
    ),
    Case(
        "all_gather -1",
        lambda x: ag.all_gather_along(x, -1),
        lambda xs, n: [torch.cat(xs, -1)] * n,
        lambda s, n: (3, SIZES[s]),
    ),
    Case(
        "reduce_scatter 0",
        lambda x: ag.reduce_scatter_along(x, 0),
        lambda xs, n: list(sum(xs).tensor_split(n, 0)),
        lambda s, n: (7, 3),
    ),
    Case(
        "reduce_scatter 1",
        lambda x: ag.reduce_scatter_along(x, 1),
        lambda xs, n: list(sum(xs).tensor_split(n, 1)),
        lambda s, n: (2, 5, 2),
    ),
    Case(
        "all_to_all heads->seq",
        lambda x: ag.all_to_all_along(x, 0, 1),
        lambda xs, n: _a2a(xs, n, 0, 1),
        lambda s, n: (5, SIZES[s], 2),
    ),
    Case(
        "all_to_all -1->0",
        lambda x: ag.all_to_all_along(x, -1, 0),
        lambda xs, n: _a2a(xs, n, -1, 0),
        lambda s, n: (SIZES[s], 2, 3),
    ),
]


def _forward_and_gradient() -> list[str]:
    n, me = dist.get_world_size(), dist.get_rank()
    for case in CASES:
        leaves = [
            _ints(case.shape(s, n), seed=s).requires_grad_()
            for s in range(1 if case.replicated_in else n)
        ]
        outs = case.ref(leaves * n if case.replicated_in else leaves, n)
        outs = outs[:1] if case.replicated_out else outs
        weights = [_ints(o.shape, seed=100 + r) for r, o in enumerate(outs)]
        sum((o * w).sum() for o, w in zip(outs, weights, strict=True)).backward()
        mine = leaves[0 if case.replicated_in else me]
        at = 0 if case.replicated_out else me
        x = mine.detach().clone().requires_grad_()
        out = case.fn(x)
        (out * weights[at]).sum().backward()
        _same(out, outs[at].detach(), f"{case.name}: output")
        _same(x.grad, mine.grad, f"{case.name}: gradient")
    return [case.name for case in CASES]


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_forward_and_gradient_equal_one_process(world_size: int) -> None:
    names = [case.name for case in CASES]
    assert spawn(_forward_and_gradient, world_size, timeout=10) == [names] * world_size


def _gradchecks() -> None:
    """Each region, in to out, through torch.autograd.gradcheck on every rank.

    gradcheck perturbs the same element on every rank at once, so it checks whole
    regions (replicated or sharded in and out), each rank with its own weights.
    """
    n, me = dist.get_world_size(), dist.get_rank()
    w = _ints((6,), seed=me) + 10  # this rank's own "layer": one weight per element
    mine = ag.split_sizes(5, n)[me]
    regions = {  # name: (region, input shape)
        "f then g": (lambda x: ag.reduce_from_group(ag.copy_to_group(x) * w), (6,)),
        "split then gather": (
            lambda x: ag.gather_from_group(ag.split_to_group(x, 0) * w[:mine], 0),
            (5,),
        ),
        "all_gather then reduce_scatter": (
            lambda x: ag.reduce_scatter_along(ag.all_gather_along(x, 0) * w, 0),
            (3,),
        ),
        "all_to_all there and back": (
            lambda x: ag.all_to_all_along(
                ag.all_to_all_along(x, 0, 1) * w[:4].view(1, 4), 1, 0
            ),
            (2, 2),  # (heads, seq) -> (heads / 2, seq * 2) -> back
        ),
    }
    for name, (region, shape) in regions.items():
        x = _ints(shape, seed=7).requires_grad_()
        assert torch.autograd.gradcheck(region, (x,)), name


def test_gradcheck_on_two_ranks() -> None:
    spawn(_gradchecks, 2, timeout=10)


def _ledger_counts() -> list[tuple[Counter, Counter]]:
    """For each op: the dist calls of its forward and of its backward, by name."""
    x = _ints((4, 3), seed=1).requires_grad_()
    ops = [
        lambda: ag.copy_to_group(x),
        lambda: ag.reduce_from_group(x),
        lambda: ag.split_to_group(x, 0),
        lambda: ag.gather_from_group(x, 0),
        lambda: ag.all_gather_along(x, 0),
        lambda: ag.reduce_scatter_along(x, 0),
        lambda: ag.all_to_all_along(x, 0, 1),
        lambda: ag.all_gather_along(x, 0, check=False),
        lambda: ag.all_gather_along(x, 0, check=False, sizes=[4] * 4),
    ]
    counts = []
    for op in ops:
        with Ledger() as forward:
            out = op()
        with Ledger() as backward:
            out.sum().backward()
        if op is ops[0]:  # copy's backward all-reduces the whole gradient:
            t = 4 * 3 * 8  # T bytes handed in, 2(n-1)/n x T on the wire on 4 ranks
            assert backward.handed_in("all_reduce") == t
            assert backward.bytes_sent("all_reduce") == 2 * 3 * t // 4
        counts.append(
            tuple(Counter(r.op for r in led.records) for led in (forward, backward))
        )
    return counts


def test_a_ledger_sees_forward_and_backward_collectives() -> None:
    n = 4  # 2 (N - 1) ring messages: a send and a recv per step, unlike other counts
    ring = 2 * (n - 1)
    want = [  # (forward, backward) calls of each op in _ledger_counts
        ({"all_gather": 1}, {"all_reduce": 1}),  # copy: check | sum
        ({"all_gather": 1, "all_reduce": 1}, {}),  # reduce: check, sum | nothing
        ({"all_gather": 1}, {"all_gather": 1}),  # split: check | gather
        ({"all_gather": 2}, {}),  # gather: check (with the sizes), data | slice
        ({"all_gather": 2}, {"batch_isend_irecv": ring}),  # | ring reduce-scatter
        ({"all_gather": 1, "batch_isend_irecv": ring}, {"all_gather": 1}),
        ({"all_gather": 1, "all_to_all_single": 1}, {"all_to_all_single": 1}),
        ({"all_gather": 2}, {"batch_isend_irecv": ring}),  # no check: sizes, data
        ({"all_gather": 1}, {"batch_isend_irecv": ring}),  # sizes given: data only
    ]
    for counts in spawn(_ledger_counts, n, timeout=10):
        assert [(dict(f), dict(b)) for f, b in counts] == want


def _mismatches() -> list[str]:
    """Calls that disagree across ranks: every rank gets a ValueError, none hangs."""
    me = dist.get_rank()
    odd = me == 1  # rank 1 makes the wrong call
    dtype = torch.float32 if odd else torch.float64
    calls = [
        lambda: ag.copy_to_group(torch.zeros(4 if odd else 3)),
        lambda: ag.reduce_from_group(torch.zeros(3, dtype=dtype)),
        lambda: ag.split_to_group(torch.zeros(7 if odd else 6, 2), 0),
        lambda: ag.gather_from_group(torch.zeros(2, 4 if odd else 3), 0),  # not dim 0
        lambda: ag.all_gather_along(torch.zeros(2, 3), 2 if odd else 1),  # bad dim
        lambda: ag.reduce_scatter_along(torch.zeros(4, 3), 1 if odd else 0),
        lambda: ag.all_to_all_along(torch.zeros(4, 2, 3), 0, 2 if odd else 1),
    ]
    errors = []
    for call in calls:
        with pytest.raises(ValueError) as err:
            call()
        errors.append(str(err.value))
    # the group survives: a matching call still works, with uneven sizes
    out = ag.gather_from_group(torch.full((me + 1,), float(me)), 0)
    assert out.tolist() == [
        float(r) for r in range(dist.get_world_size()) for _ in range(r + 1)
    ]
    return errors


@pytest.mark.parametrize("world_size", [2, 4])
def test_mismatched_calls_raise_on_every_rank(world_size: int) -> None:
    errors = spawn(_mismatches, world_size, timeout=5)
    for rank, messages in enumerate(errors):
        for message in messages[:4] + messages[5:]:
            assert "ranks disagree" in message and "rank 1:" in message, message
        assert "rank 0: copy_to_group(float32[3])" in messages[0]
        assert "rank 1: copy_to_group(float32[4])" in messages[0]
        assert "dim=1" in messages[5] and "dim=0" in messages[5]
        bad_dim = messages[4]  # rank 1 rejects its own dim; the others hear of it
        if rank == 1:
            assert "dim=2 is out of range for a 2-d tensor" in bad_dim
        else:
            assert "rank(s) [1] rejected their arguments" in bad_dim


def _disagree() -> None:
    ag.all_gather_along(torch.zeros(2, 3 + dist.get_rank()), 0)


def test_a_disagreement_reaches_the_caller_as_rank_error() -> None:
    with pytest.raises(RankError, match="ranks disagree on shape"):
        spawn(_disagree, 2, timeout=5)


def _local_errors() -> dict[str, str]:
    """Errors found on this rank alone, before any message; and the 1-rank identity."""
    x = torch.zeros(2, 3)
    for fn in (ag.copy_to_group, ag.reduce_from_group):
        assert fn(x) is x
    for fn in (
        ag.split_to_group,
        ag.gather_from_group,
        ag.all_gather_along,
        ag.reduce_scatter_along,
    ):
        assert fn(x, 1) is x
    assert ag.all_to_all_along(x, 0, 1) is x
    errors = {}
    for name, call, kind in [
        ("dim", lambda: ag.split_to_group(x, 2), ValueError),
        ("0-d", lambda: ag.all_gather_along(torch.tensor(1.0), 0), ValueError),
        ("not int", lambda: ag.gather_from_group(x, 0.5), ValueError),
        ("same dims", lambda: ag.all_to_all_along(x, 1, -1), ValueError),
        ("not a tensor", lambda: ag.reduce_from_group([1.0]), TypeError),
    ]:
        with pytest.raises(kind) as err:
            call()
        errors[name] = str(err.value)
    return errors


def test_one_rank_is_the_identity_and_bad_arguments_fail_at_once() -> None:
    [errors] = spawn(_local_errors, 1, timeout=5)
    assert errors["dim"] == (
        "split_to_group: dim=2 is out of range for a 2-d tensor of shape [2, 3]"
    )
    assert_says(
        errors,
        {
            "0-d": "out of range for a 0-d tensor",
            "not int": "dim must be an int, got 0.5",
            "same dims": "split_dim and cat_dim must differ, both are 1",
            "not a tensor": "expected a Tensor, got list",
        },
    )


def _sizes_from_the_shape() -> dict[str, object]:
    """Uneven pieces of a known logical length (SIZES, 6 in all): gathered with the
    sizes given, checked (the agreement brings them) and unchecked (exchanged);
    the host syncs and all_gathers each way; a wrong size list refused."""
    from distcourse import emulate, runtime

    r, d = dist.get_rank(), runtime.device()
    whole = _ints((6, 2), seed=3).to(d)
    x = whole.split(list(SIZES))[r]
    out: dict[str, object] = {}
    for way, call in (
        ("given", lambda: ag.gather_from_group(x, 0, check=False, sizes=SIZES)),
        ("agreed", lambda: ag.gather_from_group(x, 0)),
        ("exchanged", lambda: ag.gather_from_group(x, 0, check=False)),
    ):
        emulate.reset_host_syncs()
        with Ledger() as ledger:
            got = call()
        syncs = emulate.host_syncs()  # before .cpu() below, which counts
        gathers = sum(rec.op == "all_gather" for rec in ledger.records)
        out[way] = (torch.equal(got.cpu(), whole.cpu()), gathers, syncs)
    wrong = [2, 1, 2, 1]  # this rank's entry is wrong on ranks 1 and 2
    with pytest.raises(ValueError) as err:
        ag.all_gather_along(x, 0, sizes=wrong)
    out["refused"] = str(err.value)
    return out


def test_sizes_from_the_logical_shape_cost_no_exchange_and_no_host_sync() -> None:
    """`sizes=` (a global tensor's or a layer's logical shape) gathers with one
    all_gather and no device-to-host copy; a checked call reads the sizes from its
    agreement (one all_gather fewer than before); only an unchecked call without
    them exchanges them, at a host sync. A size list that does not fit this rank's
    piece is refused on every rank, before any data moves."""
    results = spawn(_sizes_from_the_shape, 4, backend="emulated", timeout=20)
    for r, got in enumerate(results):
        assert got["given"][:2] == (True, 1) and got["given"][2] == 0
        assert got["agreed"][:2] == (True, 2)  # the check, then the data
        assert got["exchanged"][:2] == (True, 2) and got["exchanged"][2] >= 1
        if r in (1, 2):  # its own piece does not fit the list
            assert "sizes=[2, 1, 2, 1] must give every one" in got["refused"]
        else:
            assert "rank(s) [1, 2] rejected their arguments" in got["refused"]
