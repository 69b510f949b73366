"""Negative controls for chapter 8b's verdicts: each check the chapter prints, run
on the same package calls (gt.parallelize, layouts.cut, ParallelMLP, gt.Stages,
DTensor, pipeline_mlp_bytes, checks.verdict) with a fault planted, prints FAIL /
False.

The faults: the plan's column and row layers swapped (the plan line); a loss
doubled on the global side, a gradient scale of x2 as a wrong mean would give (every
numeric comparison with one process, the module version and DTensor); one extra
all_reduce inside the ledgered step (the byte line). One spawn of 8 ranks, laid out
as the chapter's two 2 x 2 placements.
"""

from __future__ import annotations

import copy
import re

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import distcourse.global_tensor as gt
from distcourse import checks, runtime
from distcourse.comm.ledger import Ledger
from distcourse.examples.gpt import MLP
from distcourse.global_tensor import layouts
from distcourse.launch import spawn
from distcourse.parallel.tensor import ParallelMLP

S0, S1, B = gt.sbp.split(0), gt.sbp.split(1), gt.sbp.broadcast
PLAN = {
    "fc.weight": (B, S0),
    "fc.bias": (B, S0),
    "proj.weight": (B, S1),
    "proj.bias": (B, B),
}


def doubled(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The planted fault: a loss (and so every gradient) twice the right one."""
    return 2 * F.mse_loss(out, y)


def _one_stage(mine: gt.placement, device: torch.device) -> list[str]:
    """Steps 1-3 and 6 of the chapter (a 2 x 2 placement) with the faults."""
    lines = []
    torch.manual_seed(0)
    one = MLP(8).to(device)
    swapped = layouts.dp_tp_plan(one, column=["proj"], row=["fc"])  # fault
    lines.append(
        f"plan == dp_tp_plan(one, column=['fc'], row=['proj']): {PLAN == swapped}"
    )
    model = gt.parallelize(copy.deepcopy(one), mine, PLAN)
    torch.manual_seed(1)
    x, y = torch.randn(12, 8).to(device), torch.randn(12, 8).to(device)
    xg, yg = layouts.cut(x, mine, layouts.DATA), layouts.cut(y, mine, layouts.DATA)
    loss = doubled(model(xg).to_global(sbp=layouts.DATA), yg)
    loss.backward()
    ref = F.mse_loss(one(x), y)
    ref.backward()
    d = abs(loss.item() - ref.item())
    lines.append(
        f"loss {loss.item():.3f}, one process {ref.item():.3f}: "
        f"{checks.verdict(d, 1e-6)}"
    )
    for (name, t), r in zip(model.named_parameters(), one.parameters(), strict=True):
        d = (t.grad.full_tensor() - r.grad).abs().max().item()
        lines.append(f"{name} grad vs one process {checks.verdict(d, 1e-6)}")
    dp_group, tp_group = mine.groups
    mp = ParallelMLP.from_module(one, group=tp_group)
    half = mine.coord[0]
    part = F.mse_loss(mp(x.tensor_split(2)[half]), y.tensor_split(2)[half])
    part.backward()
    for t in mp.parameters():
        dist.all_reduce(t.grad, group=dp_group)
        t.grad /= 2
    dist.all_reduce(part := part.detach(), group=dp_group)
    d = abs(loss.item() - part.item() / 2)
    lines.append(f"loss vs ParallelMLP's {checks.verdict(d, 1e-6)}")
    theirs = dict(mp.named_parameters())
    for name, t in model.named_parameters():
        d = (t.grad.to_local() - theirs[name].grad).abs().max().item()
        lines.append(f"{name} my piece vs ParallelMLP's: {checks.verdict(d, 1e-6)}")
    lines += _dtensor(one, model, x, y, xg, yg, device)
    return lines


def _dtensor(
    one: nn.Module,
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    xg: torch.Tensor,
    yg: torch.Tensor,
    device: torch.device,
) -> list[str]:
    """Step 6: DTensor's step against ours, ours with the doubled loss."""
    from torch.distributed.tensor import (
        Replicate,
        Shard,
        distribute_tensor,
        init_device_mesh,
    )

    mesh = init_device_mesh(device.type, (2, 2, 2), mesh_dim_names=("pp", "dp", "tp"))
    mesh = mesh["dp", "tp"]
    words = {S0: Shard(0), S1: Shard(1), B: Replicate()}
    theirs = copy.deepcopy(one)
    for name, sig in PLAN.items():
        owner, _, leaf = name.rpartition(".")
        whole = theirs.get_parameter(name).detach()
        dt = distribute_tensor(whole, mesh, [words[s] for s in sig])
        theirs.get_submodule(owner).register_parameter(leaf, nn.Parameter(dt))
    xd, yd = (distribute_tensor(t, mesh, [Shard(0), Replicate()]) for t in (x, y))
    dt_loss = ((theirs(xd) - yd) ** 2).mean()
    dt_loss.backward()
    model.zero_grad()
    loss = doubled(model(xg).to_global(sbp=layouts.DATA), yg)
    loss.backward()
    d = abs(loss.item() - dt_loss.full_tensor().item())
    lines = [f"loss: ours vs DTensor {checks.verdict(d, 1e-6)}"]
    for (name, t), u in zip(model.named_parameters(), theirs.parameters(), strict=True):
        d = (t.grad.full_tensor() - u.grad.full_tensor()).abs().max().item()
        lines.append(f"{name} ours {t.grad.sbp} DTensor: {checks.verdict(d, 1e-6)}")
    return lines


def _pipeline(p: gt.placement, q: gt.placement, device: torch.device) -> list[str]:
    """Step 5: two stages trained with the doubled loss, and a step that sends one
    all_reduce more than the formula counts."""
    torch.manual_seed(0)
    one2 = nn.Sequential(MLP(8), MLP(8)).to(device)
    parts = copy.deepcopy(list(one2))
    plans = [layouts.dp_tp_plan(part, column=["fc"], row=["proj"]) for part in parts]
    stages = gt.Stages(parts, [p, q], plans)
    k = stages.stage
    opt = torch.optim.SGD(stages.module.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(one2.parameters(), lr=0.1)
    torch.manual_seed(2)
    losses, refs, diffs = [], [], []
    for _ in range(3):
        xp, yp = torch.randn(8, 8).to(device), torch.randn(8, 8).to(device)
        opt.zero_grad(), ref_opt.zero_grad()
        with Ledger() as ledger:
            losses.append(stages.step(xp, yp, doubled, micro_batches=2))
            extra = torch.zeros(4, device=device)
            dist.all_reduce(extra, group=(p if k == 0 else q).groups[0])  # fault
        refs.append(F.mse_loss(one2(xp), yp))
        refs[-1].backward()
        pairs = zip(stages.module.parameters(), one2[k].parameters(), strict=True)
        diffs += [(t.grad.full_tensor() - r.grad).abs().max().item() for t, r in pairs]
        opt.step(), ref_opt.step()
    d = checks.max_over_ranks(max(diffs))
    lines = [
        f"every gradient of 3 steps, both stages, vs one process "
        f"{checks.verdict(d, 1e-6)}"
    ]
    if k == 1:
        d = max(abs(a - b.item()) for a, b in zip(losses, refs, strict=True))
        lines.append(
            f"losses {[round(v, 3) for v in losses]}, one process "
            f"{[round(v.item(), 3) for v in refs]}: {checks.verdict(d, 1e-6)}"
        )
    pairs = zip(stages.module.parameters(), one2[k].parameters(), strict=True)
    d = max((t.full_tensor() - r).abs().max().item() for t, r in pairs)
    d = checks.max_over_ranks(d)
    lines.append(
        f"parameters after 3 steps, both stages, vs one process "
        f"{checks.verdict(d, 1e-6)}"
    )
    want = gt.stages.pipeline_mlp_bytes(k, 2, 8, 8, 32, dp=2, tp=2, micro_batches=2)
    miss = checks.max_over_ranks(abs(ledger.bytes_sent() - want))
    lines.append(f"last step's bytes, every rank: ledger == formula: {miss == 0}")
    return lines


def _faults() -> list[str]:
    torch.set_num_threads(1)
    device = runtime.device()
    p = gt.placement(device.type, ranks=[[0, 1], [2, 3]])
    q = gt.placement(device.type, ranks=[[4, 5], [6, 7]])
    mine = p if dist.get_rank() < 4 else q
    return _one_stage(mine, device) + _pipeline(p, q, device)


@pytest.fixture(scope="module")
def lines() -> list[str]:
    """Rank 4's lines (a rank of the last stage: it holds the loss)."""
    return spawn(_faults, 8, timeout=120)[4]


def _ending(lines: list[str], pattern: str) -> list[str]:
    hits = [ln for ln in lines if re.search(pattern, ln)]
    assert hits, (pattern, lines)
    return hits


@pytest.mark.controls(
    "08b_hybrid_global",
    r"plan == dp_tp_plan\(one, column=\['fc'\], row=\['proj'\]\)",
    fault="the plan written with column and row layers swapped",
)
def test_a_swapped_plan_is_not_the_plan(lines: list[str]) -> None:
    (hit,) = _ending(lines, r"plan == dp_tp_plan")
    assert hit.endswith(": False"), hit


@pytest.mark.controls(
    "08b_hybrid_global",
    r"loss [\d.]+, one process [\d.]+:",
    fault="a loss doubled on the global side (every gradient x2)",
)
@pytest.mark.controls(
    "08b_hybrid_global",
    r"grad \(.*\)\s+vs one process",
    fault="a loss doubled on the global side (every gradient x2)",
)
@pytest.mark.controls(
    "08b_hybrid_global",
    r"loss vs ParallelMLP's",
    fault="a loss doubled on the global side (every gradient x2)",
)
@pytest.mark.controls(
    "08b_hybrid_global",
    r"my piece .* vs ParallelMLP's",
    fault="a loss doubled on the global side (every gradient x2)",
)
@pytest.mark.controls(
    "08b_hybrid_global",
    r"loss: ours vs DTensor",
    fault="a loss doubled on the global side (every gradient x2)",
)
@pytest.mark.controls(
    "08b_hybrid_global",
    r"ours \(.*\)\s+DTensor \(",
    fault="a loss doubled on the global side (every gradient x2)",
)
@pytest.mark.controls(
    "08b_hybrid_global",
    r"every gradient of 3 steps, both stages, vs one process",
    fault="a loss doubled on the global side (every gradient x2)",
)
@pytest.mark.controls(
    "08b_hybrid_global",
    r"losses \[.*\], one process \[",
    fault="a loss doubled on the global side (every gradient x2)",
)
@pytest.mark.controls(
    "08b_hybrid_global",
    r"parameters after 3 steps, both stages, vs one process",
    fault="a loss doubled on the global side (every gradient x2)",
)
def test_a_doubled_gradient_fails_every_comparison(lines: list[str]) -> None:
    for pattern in (
        r"^loss [\d.]+, one process",
        r"grad vs one process",
        r"loss vs ParallelMLP's",
        r"my piece vs ParallelMLP's",
        r"loss: ours vs DTensor",
        r"ours .* DTensor:",
        r"every gradient of 3 steps",
        r"^losses \[",
        r"parameters after 3 steps",
    ):
        for hit in _ending(lines, pattern):
            assert hit.endswith("FAIL"), (pattern, hit)


@pytest.mark.controls(
    "08b_hybrid_global",
    r"ledger == formula",
    fault="one all_reduce more in the step than the formula counts",
)
def test_an_extra_all_reduce_breaks_the_byte_line(lines: list[str]) -> None:
    (hit,) = _ending(lines, r"ledger == formula")
    assert hit.endswith(": False"), hit
