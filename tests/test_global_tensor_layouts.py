"""distcourse.global_tensor.layouts on 4 real gloo ranks: the DP x TP layout of an
MLP on a 2 x 2 placement, one signature per tensor, equals one process (loss and
every gradient) and chapter 4's tensor-parallel modules (ParallelMLP on the mesh
rows' groups, gradients all-reduced over its columns) on the same weights; its
bytes per step equal layouts.mlp_step_bytes (and hand-counted numbers); bad input
raises before any message. Chapter 7's two-layer model, parallelized with the
unnamed parameters broadcast (rest=B), trains data parallel, model parallel and
2-D as one process, and every gradient has its parameter's signature.

Tolerance 1e-6 (float32, values of order 1: a few ulps of the sums' reordering).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from helpers import refused_on
from torch import nn

import distcourse.global_tensor as gt
from distcourse import checks
from distcourse.comm.ledger import Ledger
from distcourse.examples.gpt import MLP
from distcourse.global_tensor import layouts
from distcourse.global_tensor.layouts import mlp_step_bytes
from distcourse.launch import spawn
from distcourse.parallel.tensor import ParallelMLP

TOL = 1e-6
C, ROWS = 8, 12  # MLP(8): fc Linear(8, 32), proj Linear(32, 8); a batch of 12 rows


def _dp_tp() -> dict:
    torch.set_num_threads(1)
    p = gt.placement("cpu", ranks=[[0, 1], [2, 3]])
    torch.manual_seed(0)
    one = MLP(C)
    model = MLP(C)
    model.load_state_dict(one.state_dict())
    module = ParallelMLP.from_module(one, group=p.groups[1])  # TP along the rows
    gt.parallelize(model, p, layouts.dp_tp_plan(model, ["fc"], ["proj"]))
    torch.manual_seed(1)
    x, y = torch.randn(ROWS, C), torch.randn(ROWS, C)
    xg, yg = layouts.cut(x, p, layouts.DATA), layouts.cut(y, p, layouts.DATA)
    with Ledger() as unboxed:  # the loss boxes the P output, its backward again
        F.mse_loss(model(xg), yg).backward()
    model.zero_grad()
    with Ledger() as ledger:
        out = model(xg).to_global(sbp=layouts.DATA)
        loss = F.mse_loss(out, yg)
        loss.backward()
    got = {"loss": loss.item(), "bytes": ledger.bytes_sent()}
    got["unboxed"] = unboxed.bytes_sent()
    ref = F.mse_loss(one(x), y)  # one process
    ref.backward()
    mine = x.tensor_split(2)[p.coord[0]], y.tensor_split(2)[p.coord[0]]
    part = F.mse_loss(module(mine[0]), mine[1])  # chapter 4's modules, DP by hand
    part.backward()
    for q in module.parameters():
        dist.all_reduce(q.grad, group=p.groups[0])
        q.grad /= 2
    dist.all_reduce(part.detach(), group=p.groups[0])
    got["d_loss_one"] = abs(got["loss"] - ref.item())
    got["d_loss_module"] = abs(got["loss"] - part.item() / 2)
    theirs = dict(module.named_parameters())
    for name, q in model.named_parameters():
        want = dict(one.named_parameters())[name].grad
        got[f"one {name}"] = (q.grad.full_tensor() - want).abs().max().item()
        piece = theirs[name].grad  # this rank's shard in the module version
        got[f"module {name}"] = (q.grad.to_local() - piece).abs().max().item()
    got["sbp"] = layouts.signatures(model)
    return got


def test_dp_x_tp_equals_one_process_and_the_module_version() -> None:
    for rank, got in enumerate(spawn(_dp_tp, 4, timeout=60)):
        assert got["sbp"] == {
            "fc.weight": ("(B, S(0))", "(B, S(0))"),
            "fc.bias": ("(B, S(0))", "(B, S(0))"),
            "proj.weight": ("(B, S(1))", "(B, S(1))"),
            "proj.bias": ("(B, B)", "(B, B)"),
        }
        diffs = {k: v for k, v in got.items() if k.startswith(("d_", "one", "mod"))}
        assert len(diffs) == 10 and all(v <= TOL for v in diffs.values()), diffs
        # 6 rows x 8 x 4 = 192 bytes on the TP all_reduce, 4 * (8 + 128 + 128 + 16)
        # = 1120 on the DP all_reduces
        assert got["bytes"] == mlp_step_bytes(ROWS, C, 4 * C, 2, 2) == 1312, rank
        want = mlp_step_bytes(ROWS, C, 4 * C, 2, 2, boxed=False)
        assert got["unboxed"] == want == 1312 + 192, rank


def _wire_bytes() -> dict[str, int]:
    """Ledger bytes of a boxed step on a 4 x 2 and a 2 x 4 placement of 8 ranks,
    where the ring's 2(n - 1)/n is not 1 (on 2 x 2 wire bytes equal the tensors)."""
    torch.set_num_threads(1)
    shapes = {"4x2": (4, 2), "2x4": (2, 4)}
    places = {
        k: gt.placement("cpu", ranks=torch.arange(8).view(v).tolist())
        for k, v in shapes.items()
    }
    got = {}
    for name, p in places.items():
        torch.manual_seed(0)
        model = gt.parallelize(MLP(C), p, layouts.dp_tp_plan(MLP(C), ["fc"], ["proj"]))
        x, y = torch.randn(ROWS, C), torch.randn(ROWS, C)
        xg, yg = layouts.cut(x, p, layouts.DATA), layouts.cut(y, p, layouts.DATA)
        with Ledger() as ledger:
            F.mse_loss(model(xg).to_global(sbp=layouts.DATA), yg).backward()
        got[name] = ledger.bytes_sent()
    return got


def test_step_bytes_are_wire_bytes_on_groups_of_four() -> None:
    want = {
        name: mlp_step_bytes(ROWS, C, 4 * C, dp, tp)
        for name, (dp, tp) in {"4x2": (4, 2), "2x4": (2, 4)}.items()
    }
    for rank, got in enumerate(spawn(_wire_bytes, 8, timeout=60)):
        assert got == want, (rank, got, want)


def _errors() -> list[str]:
    p = gt.placement("cpu", ranks=[[0, 1], [2, 3]])
    B, P = gt.sbp.broadcast, gt.sbp.partial_sum
    S0, S2 = gt.sbp.split(0), gt.sbp.split(2)
    odd = nn.Linear(8, 5)
    cases = {
        "world": lambda: gt.placement("cpu", ranks=[[0, 1], [2, 5]]),
        "divide": lambda: gt.parallelize(odd, p, {"weight": (B, S0), "bias": (B, B)}),
        "range": lambda: gt.parallelize(odd, p, {"weight": (B, S2), "bias": (B, B)}),
        "partial": lambda: gt.parallelize(odd, p, {"weight": (P, B), "bias": (B, B)}),
        "ndim": lambda: gt.parallelize(odd, p, {"weight": S0, "bias": (B, B)}),
        "missing": lambda: gt.parallelize(odd, p, {"weight": (B, B)}),
        "unknown": lambda: gt.parallelize(
            odd, p, {"weight": (B, B), "bias": (B, B), "fc.weight": (B, B)}
        ),
        "linear": lambda: layouts.dp_tp_plan(MLP(8), column=["drop"]),
        "type": lambda: gt.parallelize(odd, [[0, 1], [2, 3]], {}),
    }
    return checks.outcomes(cases)


def test_bad_input_raises_on_every_rank_before_any_message() -> None:
    refused_on(
        _errors,
        4,
        "placement ranks [5] are not ranks of this world",
        "weight: (B, S(0)) splits dim 0 of shape [5, 8] 2 ways, but 5",
        "split(2) is out of range for a 2-d tensor",
        "weight: a parameter cannot be a partial sum",
        "the placement is 2-D: give one SBP per mesh dimension",
        "plan gives no signature for ['bias']",
        "plan names ['fc.weight'], which are not parameters",
        "'drop' must name an nn.Linear of the model, it names Dropout",
        "placement must be a Placement",
    )


S0, S1 = gt.sbp.split(0), gt.sbp.split(1)
B = gt.sbp.broadcast
COLUMN_ROW = {"0.weight": S0, "0.bias": S0, "2.weight": S1}
LAYOUTS = {  # name: (placement ranks, data signature, parameter plan)
    "data parallel": ([0, 1, 2, 3], S0, {}),
    "model parallel": ([0, 1, 2, 3], B, COLUMN_ROW),
    "2-D": ([[0, 1], [2, 3]], (S0, B), {k: (B, v) for k, v in COLUMN_ROW.items()}),
}


def _train_layout(name: str) -> tuple[list, list, dict, dict, float, tuple]:
    ranks, data_sig, plan = LAYOUTS[name]
    p = gt.placement("cpu", ranks=ranks)
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(10, 8), nn.ReLU(), nn.Linear(8, 5))
    model = gt.parallelize(copy.deepcopy(ref), p, plan, rest=B)
    b = (B,) * p.ndim
    losses, want, worst = [], [], 0.0
    for m, out in ((model, losses), (ref, want)):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        torch.manual_seed(1)
        for _ in range(3):
            x, y = torch.randn(8, 10), torch.randn(8, 5)
            if m is model:
                x, y = (gt.to_global(t, p, b).to_global(sbp=data_sig) for t in (x, y))
            loss = nn.functional.mse_loss(m(x), y)
            opt.zero_grad()
            with Ledger() as ledger:
                loss.backward()
            opt.step()
            out.append(loss.item())
        if m is model:  # the backward's bytes by the group of ranks they ran between
            sent: dict[tuple, int] = {}
            for r in ledger.records:
                sent[r.ranks] = sent.get(r.ranks, 0) + r.bytes
    for q, r in zip(model.parameters(), ref.parameters(), strict=True):
        worst = max(worst, (q.grad.full_tensor() - r.grad).abs().max().item())
    grads = {n: q.grad.sbp for n, q in model.named_parameters()}
    sigs = {n: sig for n, (sig, _) in layouts.signatures(model).items()}
    pieces = sum(q.to_local().numel() * 4 for q in model.parameters())
    return losses, want, sigs, grads, worst, (sent, pieces)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layouts_train_as_one_process(name: str) -> None:
    results = spawn(_train_layout, 4, name, timeout=60)
    for rank, (losses, want, sigs, grads, worst, (sent, pieces)) in enumerate(results):
        assert all(abs(a - b) <= 1e-5 for a, b in zip(losses, want, strict=True))
        assert worst <= 1e-5
        assert {n: gt.sbp.describe(s) for n, s in grads.items()} == sigs
        assert sigs["0.weight"] != "B" or name == "data parallel"
        # the data-parallel sum of the gradients runs between the ranks that hold
        # the same pieces, and carries exactly them (measured, not assumed)
        if name == "data parallel":
            assert sent == {(0, 1, 2, 3): pieces}
        if name == "2-D":
            column = (rank % 2, rank % 2 + 2)  # mesh dimension 0
            row = (rank - rank % 2, rank - rank % 2 + 1)  # the output all-reduced again
            assert sent == {column: pieces, row: 4 * 5 * 4}


def _unknown() -> str:
    p = gt.placement("cpu", ranks=[0, 1])
    try:
        gt.parallelize(nn.Linear(2, 2), p, {"weigth": S0}, rest=B)
    except ValueError as err:
        return str(err)
    return "no error"


def test_a_misspelt_name_is_refused() -> None:
    errors = spawn(_unknown, 2)
    assert all("plan names ['weigth'], which are not parameters" in e for e in errors)
