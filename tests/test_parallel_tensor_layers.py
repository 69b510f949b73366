"""Column- and row-parallel linear layers on real gloo ranks: equal to one nn.Linear
(outputs and every gradient), equal to torch's ColwiseParallel / RowwiseParallel, and
bad input is a ValueError on every rank before any data moves.

float32; TOL is far above rounding noise (about 1e-7 here) and far below any bug.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from helpers import torch_parallelized
from spawned import assert_within, max_diff
from torch import nn

from distcourse.comm.ledger import Ledger
from distcourse.launch import spawn
from distcourse.parallel.tensor import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
)

TOL = 1e-5


def _column_then_row() -> dict[str, float]:
    """Linear -> GELU -> Linear, one process and split; max differences by name."""
    n, r = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(0)  # the same layers and input on every rank
    fc, proj = nn.Linear(8, 12), nn.Linear(12, 6)
    x = torch.randn(3, 5, 8, requires_grad=True)
    (proj(F.gelu(fc(x))) ** 2).sum().backward()
    col, row = ColumnParallelLinear.from_linear(fc), RowParallelLinear.from_linear(proj)
    x2 = x.detach().clone().requires_grad_()
    y = row(F.gelu(col(x2)))
    (y**2).sum().backward()
    diffs = {
        "output": max_diff(y, proj(F.gelu(fc(x)))),
        "input grad": max_diff(x2.grad, x.grad),
        "column weight grad": max_diff(col.weight.grad, fc.weight.grad.chunk(n, 0)[r]),
        "column bias grad": max_diff(col.bias.grad, fc.bias.grad.chunk(n, 0)[r]),
        "row weight grad": max_diff(row.weight.grad, proj.weight.grad.chunk(n, 1)[r]),
        "row bias grad": max_diff(row.bias.grad, proj.bias.grad),
    }
    # the other two modes: a gathered output, a full input split inside the layer
    x3 = x.detach().clone().requires_grad_()
    whole = ColumnParallelLinear.from_linear(fc, gather_output=True)(x3)
    diffs["gathered output"] = max_diff(whole, fc(x))
    h = torch.randn(3, 5, 12, requires_grad=True)
    h2 = h.detach().clone().requires_grad_()
    split = RowParallelLinear.from_linear(proj, input_is_parallel=False)
    split(h2).sum().backward()
    proj(h).sum().backward()
    diffs["split input grad"] = max_diff(h2.grad, h.grad)
    # the way back is exact: gathering the slices gives the original weights
    for layer, lin in ((col, fc), (row, proj)):
        back = layer.to_linear()
        assert torch.equal(back.weight, lin.weight) and torch.equal(back.bias, lin.bias)
    return diffs


@pytest.mark.parametrize("world_size", [2, 4])
def test_column_and_row_parallel_equal_one_linear(world_size: int) -> None:
    assert_within(_column_then_row, world_size, tol=TOL)


def _against_torch() -> dict[str, float]:
    """Ours beside torch's parallelize_module(ColwiseParallel, RowwiseParallel)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
    x = torch.randn(4, 8)
    theirs = torch_parallelized(mlp, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    col = ColumnParallelLinear.from_linear(mlp[0])
    row = RowParallelLinear.from_linear(mlp[2])
    y_theirs, y_ours = theirs(x), row(F.gelu(col(x)))
    (y_theirs**2).sum().backward()
    (y_ours**2).sum().backward()
    return {
        "output": max_diff(y_ours, y_theirs),
        "column weight grad": max_diff(
            col.weight.grad, theirs[0].weight.grad.to_local()
        ),
        "column bias grad": max_diff(col.bias.grad, theirs[0].bias.grad.to_local()),
        "row weight grad": max_diff(row.weight.grad, theirs[2].weight.grad.to_local()),
        "row bias grad": max_diff(row.bias.grad, theirs[2].bias.grad.full_tensor()),
    }


def test_equal_to_torch_parallelize_module() -> None:
    assert_within(_against_torch, 2, tol=TOL)


def _errors(case: str, group: dist.ProcessGroup) -> tuple[str, list[str]]:
    """Run one kind of bad input on this rank: (its error, the collectives it made)."""
    r = dist.get_rank()
    with Ledger() as ledger:
        try:
            if case == "not divisible":
                ColumnParallelLinear(8, 9)
            elif case == "row not divisible":
                RowParallelLinear(9, 8)
            elif case == "not a member":
                ColumnParallelLinear(8, 4, group=group)  # group: rank 0 only
            elif case == "shapes differ":
                ColumnParallelLinear(8, 4)(torch.randn(2, 3 + r, 8))
            elif case == "full input to row":
                RowParallelLinear(8, 4)(torch.randn(2, 8))
            elif case == "full input on one rank":
                RowParallelLinear(8, 4)(torch.randn(2, 8 if r == 1 else 4))
            elif case == "wrong features":
                ColumnParallelLinear(8, 4)(torch.randn(2, 6))
            elif case == "checkpoint of another shape":
                layer = ColumnParallelLinear(8, 4)
                layer.load_full_state_dict(nn.Linear(8, 6).state_dict())
        except ValueError as err:
            return str(err), [rec.op for rec in ledger.records if rec.bytes != 112]
    return "no error", []


# the error each rank must raise: (rank 0's, rank 1's); None: no error there
BAD = {
    "not divisible": "out_features=9 is not divisible by tensor-parallel size 2",
    "row not divisible": "in_features=9 is not divisible by tensor-parallel size 2",
    "not a member": (None, "rank 1 is not a member of the group"),
    "shapes differ": "ranks disagree on shape",
    "full input to row": "was fed a full input (8 features)",
    "full input on one rank": (
        "rank(s) [1] rejected their arguments",
        "was fed a full input (8 features)",
    ),
    "wrong features": "expected (..., in_features=8)",
    "checkpoint of another shape": "'weight' has shape [6, 8], this layer needs [4, 8]",
}


def _all_errors() -> dict[str, tuple[str, list[str]]]:
    group = dist.new_group([0])  # every rank calls new_group; only rank 0 is in it
    return {case: _errors(case, group) for case in BAD}


def test_bad_input_is_an_error_on_every_rank_before_any_data_moves() -> None:
    by_rank = spawn(_all_errors, 2, timeout=5, deadline=60)  # a hang would fail
    for case, want in BAD.items():
        wants = want if isinstance(want, tuple) else (want, want)
        for r, expected in enumerate(wants):
            message, data_moved = by_rank[r][case]
            if expected is None:
                assert message == "no error", (case, r, message)
                continue
            assert expected in message, (case, r, message)
            assert data_moved == [], (case, r, data_moved)  # at most the agreement


def _misspelt(kind: type) -> str:
    try:
        kind(8, 4, sequence_paralel=True)
    except TypeError as err:
        return str(err)
    return "no error"


def test_a_misspelt_option_is_refused_as_a_signature_would() -> None:
    """The options every split layer shares come as keyword arguments checked
    against their list (layers.SplitOptions): a typo is a TypeError, not ignored."""
    for kind in (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding):
        said = spawn(_misspelt, 2, kind)[0]
        name = kind.__name__
        assert said == f"{name}() got an unexpected keyword argument 'sequence_paralel'"
