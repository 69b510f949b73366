"""distcourse.global_tensor.stages on 8 real gloo ranks: two MLP stages, each DP x TP
on its own 2 x 2 placement ([[0, 1], [2, 3]] and [[4, 5], [6, 7]]), activations
moved between them by to_global. Three SGD steps of 2 micro-batches equal one
process (losses, every gradient, every parameter, tolerance 1e-6); the bytes of a
step equal the formula derived below on every rank; bad input raises before any
message.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import distcourse.global_tensor as gt
from distcourse.comm.ledger import Ledger
from distcourse.examples.gpt import MLP
from distcourse.global_tensor import layouts
from distcourse.launch import spawn

TOL = 1e-6
C, ROWS, MICRO, STEPS = 8, 8, 2, 3


def step_bytes(stage: int, rows: int, c: int, hidden: int, m: int) -> int:
    """Bytes one rank sends in a step (2 x 2 placements, float32), derived from the
    ops: a = this rank's piece of one micro-batch's activation (rows / m / 2 rows).

    stage 0, per micro-batch: the row layer's all_reduce (a), the move's all_gather
      on mesh dim 0 (8 + a) and its send (header 80 + a); in backward, the ack of
      the gradient's receive (80): 3a + 168.
    stage 1, per micro-batch: the ack of the activation's receive (80), the row
      layer's all_reduce (a); in backward, the column layer's input gradient P -> B
      (a: Megatron's f), the all_gather (8 + a) and send (80 + a) of the move back;
      and the loss's P -> B for `.item()` (4): 4a + 172.
    both, per micro-batch: each parameter gradient's all_reduce over mesh dim 0.
    """
    a = rows // m // 2 * c * 4
    dp = 4 * (c + 2 * c * hidden // 2 + hidden // 2)
    per_micro = 3 * a + 168 if stage == 0 else 4 * a + 172
    return m * (per_micro + dp)


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
            got["grads"] = max((mine[n].grad.full_tensor() - theirs[n].grad)
                               .abs().max().item() for n in mine)  # fmt: skip
        opt.step()
        ref_opt.step()
    mine = dict(stages.module.named_parameters())
    theirs = dict(one[stages.stage].named_parameters())
    got["params"] = max((mine[n].full_tensor() - theirs[n]).abs().max().item()
                        for n in mine)  # fmt: skip
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
        want = step_bytes(stage, ROWS, C, 4 * C, MICRO)
        assert got["bytes"] == want, (rank, got["bytes"], want)
    # hand-counted for stage 0: a = 2 rows x 8 x 4 = 64; per micro-batch
    # 3 x 64 + 168 + 4 x (8 + 128 + 128 + 16) = 1480, twice
    assert step_bytes(0, ROWS, C, 4 * C, MICRO) == 2960


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
    got = []
    for name, fn in cases.items():
        try:
            fn()
            got.append(f"{name}: no error")
        except (ValueError, TypeError) as err:
            got.append(f"{name}: {err}")
    ok = gt.Stages([MLP(C), MLP(C)], [first, gt.placement("cpu", ranks=[[4, 5],
                                                                         [6, 7]])],
                   plans)  # fmt: skip
    try:
        ok.step(torch.randn(6, C), torch.randn(6, C), F.mse_loss, micro_batches=2)
        got.append("batch: no error")
    except ValueError as err:
        got.append(f"batch: {err}")
    return got


def test_bad_input_raises_on_every_rank_before_any_message() -> None:
    for lines in spawn(_errors, 8, timeout=10):
        text = "\n".join(lines)
        assert "no error" not in text, text
        for words in ("placement ranks [8] are not ranks of this world",
                      "2 parts, 1 placements and 2 plans",
                      "rank 2 is in placements 0 and 1",
                      "of another shape than placement 0",
                      "plan gives no signature for",
                      "a batch of 6 rows does not divide into 2 micro"):  # fmt: skip
            assert words in text, (words, text)
