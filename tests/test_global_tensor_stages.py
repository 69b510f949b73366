"""distcourse.global_tensor.stages on 8 real gloo ranks: two MLP stages, each DP x TP
on its own 2 x 2 placement ([[0, 1], [2, 3]] and [[4, 5], [6, 7]]), activations
moved between them by to_global. Three SGD steps of 2 micro-batches equal one
process (losses, every gradient, every parameter, tolerance 1e-6); the bytes of a
step equal stages.pipeline_mlp_bytes (and hand-counted numbers) on every rank; bad
input raises before any message.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from helpers import refused_on
from torch import nn

import distcourse.global_tensor as gt
from distcourse import checks
from distcourse.comm.ledger import Ledger
from distcourse.examples.gpt import MLP
from distcourse.global_tensor import layouts
from distcourse.global_tensor.stages import pipeline_mlp_bytes
from distcourse.launch import spawn

TOL = 1e-6
C, ROWS, MICRO, STEPS = 8, 8, 2, 3


def _pipeline() -> dict:
    torch.set_num_threads(1)
    first = gt.placement("cpu", ranks=[[0, 1], [2, 3]])
    second = gt.placement("cpu", ranks=[[4, 5], [6, 7]])
    torch.manual_seed(0)
    one = nn.Sequential(MLP(C), MLP(C))
    parts = [MLP(C), MLP(C)]
    for part, ref in zip(parts, one, strict=True):
        part.load_state_dict(ref.state_dict())
    plans = [layouts.dp_tp_plan(part, ["fc"], ["proj"]) for part in parts]
    stages = gt.Stages(parts, [first, second], plans)
    opt = torch.optim.SGD(stages.module.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(one.parameters(), lr=0.1)
    torch.manual_seed(1)
    got: dict = {"losses": [], "want": [], "stage": stages.stage}
    for step in range(STEPS):
        x, y = torch.randn(ROWS, C), torch.randn(ROWS, C)
        opt.zero_grad()
        with Ledger() as ledger:
            got["losses"].append(stages.step(x, y, F.mse_loss, MICRO))
        got.setdefault("bytes", ledger.bytes_sent())
        ref_opt.zero_grad()
        ref = F.mse_loss(one(x), y)
        ref.backward()
        got["want"].append(ref.item())
        if step == STEPS - 1:  # the last step's gradients, before its update
            mine = dict(stages.module.named_parameters())
            theirs = dict(one[stages.stage].named_parameters())
            got["grads"] = max(
                (mine[n].grad.full_tensor() - theirs[n].grad).abs().max().item()
                for n in mine
            )
        opt.step()
        ref_opt.step()
    mine = dict(stages.module.named_parameters())
    theirs = dict(one[stages.stage].named_parameters())
    got["params"] = max(
        (mine[n].full_tensor() - theirs[n]).abs().max().item() for n in mine
    )
    got["sbp"] = layouts.signatures(stages.module)
    return got


def test_two_stages_of_2x2_equal_one_process() -> None:
    for rank, got in enumerate(spawn(_pipeline, 8, timeout=60)):
        stage = rank // 4
        assert got["stage"] == stage
        if stage == 1:  # the loss lives on the last stage's ranks
            pairs = zip(got["losses"], got["want"], strict=True)
            diffs = [abs(a - b) for a, b in pairs]
            assert len(diffs) == STEPS and max(diffs) <= TOL, got
        else:
            assert got["losses"] == [None] * STEPS
        assert got["grads"] <= TOL and got["params"] <= TOL, got
        assert got["sbp"]["fc.weight"] == ("(B, S(0))", "(B, S(0))")
        want = pipeline_mlp_bytes(stage, 2, ROWS, C, 4 * C, 2, 2, MICRO)
        assert got["bytes"] == want, (rank, got["bytes"], want)
    # hand-counted, a = 2 rows x 8 x 4 = 64 bytes; gradients 4 x (8 + 128 + 128 +
    # 16) = 1120; stage 0 per micro-batch: a (row layer) + a + 80 + a (move) + 80
    # (ack) + 1120 = 1472, stage 1: 80 + a + a + a + 80 + a + 4 + 1120 = 1540 (the
    # move's gather takes its pieces' lengths from the logical shape: no sizes
    # travel); two micro-batches
    assert [pipeline_mlp_bytes(k, 2, ROWS, C, 4 * C, 2, 2, MICRO) for k in (0, 1)] == [
        2944,
        3080,
    ]


def _errors() -> list[str]:
    first = gt.placement("cpu", ranks=[[0, 1], [2, 3]])
    second = gt.placement("cpu", ranks=[[2, 3], [4, 5]])
    flat = gt.placement("cpu", ranks=[4, 5, 6, 7])
    parts = [MLP(C), MLP(C)]
    plans = [layouts.dp_tp_plan(p, ["fc"], ["proj"]) for p in parts]
    cases = {
        "world": lambda: gt.placement("cpu", ranks=[[4, 5], [6, 8]]),
        "count": lambda: gt.Stages(parts, [first], plans),
        "overlap": lambda: gt.Stages(parts, [first, second], plans),
        "shape": lambda: gt.Stages(parts, [first, flat], plans),
        "plan": lambda: gt.Stages(parts, [first, second], [plans[0], {}]),
    }
    ok = gt.Stages(
        [MLP(C), MLP(C)], [first, gt.placement("cpu", ranks=[[4, 5], [6, 7]])], plans
    )
    cases["batch"] = lambda: ok.step(
        torch.randn(6, C), torch.randn(6, C), F.mse_loss, micro_batches=2
    )
    return checks.outcomes(cases)


def test_bad_input_raises_on_every_rank_before_any_message() -> None:
    refused_on(
        _errors,
        8,
        "placement ranks [8] are not ranks of this world",
        "2 parts, 1 placements and 2 plans",
        "rank 2 is in placements 0 and 1",
        "of another shape than placement 0",
        "plan gives no signature for",
        "a batch of 6 rows does not divide into 2 micro",
    )
