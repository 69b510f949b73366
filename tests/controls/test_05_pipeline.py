"""Negative controls of chapter 5: each verdict it prints, shown failing on a fault.

The chapter's verdicts: step 4's "held what in_flight predicts"
(`pp.held_as_predicted`, from the runner's activation meter), and steps 5 and 6's
"loss and all gradients <= 1e-06" (`checks.verdict` on the largest difference from
one process) for our runners and torch's schedules. Here the same checks run on a
planted fault: a runner that never
frees a micro-batch's activations; and a loss summed over the micro-batches instead
of averaged (every gradient m times too large). The rank checks share one spawn of 2
ranks; the chapter's model is the same (Linear + ReLU blocks, width 16).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from distcourse import checks, torchcompat
from distcourse.bench.pipeline import Block
from distcourse.launch import spawn
from distcourse.parallel import pipeline as pp
from distcourse.parallel.pipeline.plain import PlainPipeline
from distcourse.parallel.pipeline.torch_side import CLASSES, SCHEDULES, TorchPipeline

WIDTH, M = 16, 4  # 2 ranks, m = 4: the chapter's blocks, a smaller pipe
# torch's schedules that run on gloo here: the V-shaped ones need torch 2.14
ON_GLOO = tuple(
    name
    for name in SCHEDULES
    if CLASSES[name][1] != "V" or torchcompat.V_SCHEDULES_ON_GLOO
)


def _loss_times_m(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The fault: the runner divides each micro-batch's loss by m, this undoes it."""
    return F.mse_loss(out, y) * M


def _faults() -> dict[str, object]:
    """On each of 2 ranks: every verdict's check, run with its planted fault."""
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(*[Block(WIDTH, 0) for _ in range(8)])
    gen = torch.Generator().manual_seed(1)
    x, y = (torch.randn(4 * M, WIDTH, generator=gen) for _ in range(2))
    alone = copy.deepcopy(model)
    want = F.mse_loss(alone(x), y)
    want.backward()

    def differences(local: dict, loss: torch.Tensor | None, n_stages: int) -> float:
        ref = pp.split_by_count(alone, n_stages)
        found = [abs(loss.item() - want.item())] if loss is not None else []
        for s, stage in local.items():
            found += [
                (a.grad - b.grad).abs().max().item()
                for a, b in zip(stage.parameters(), ref[s].parameters(), strict=True)
            ]
        return checks.max_over_ranks(max(found))

    lines = {}
    schedules = {
        "GPipe": pp.gpipe(2, M),
        "1F1B": pp.one_f_one_b(2, M),
        "interleaved 1F1B (v=2)": pp.interleaved(2, M, 2),
        "ZB-H1": pp.zb_h1(2, M),
    }
    for name, sched in schedules.items():
        stages = pp.split_by_count(copy.deepcopy(model), sched.stages)
        pipe = pp.Pipeline(stages, sched, _loss_times_m)
        worst = differences(pipe.local, pipe.step(x, y), sched.stages)
        pipe.close()
        lines[name] = f"loss and all gradients {checks.verdict(worst, 1e-6)}"
        if name == "ZB-H1":
            continue
        stages = pp.split_by_count(copy.deepcopy(model), sched.stages)
        plain = PlainPipeline(stages, sched, _loss_times_m)
        worst = differences(plain.local, plain.step(x, y), sched.stages)
        lines[f"plain {name}"] = f"loss and all gradients {checks.verdict(worst, 1e-6)}"
    for name in ON_GLOO:
        n_stages = 2 if name in ("GPipe", "1F1B") else 4
        stages = pp.split_by_count(copy.deepcopy(model), n_stages)
        theirs = TorchPipeline(stages, name, M, _loss_times_m)
        loss = theirs.step(x, y)
        worst = differences({s: stages[s] for s in theirs.mine}, loss, n_stages)
        lines[f"torch {name}"] = f"loss and all gradients {checks.verdict(worst, 1e-6)}"

    # a runner whose activations are never freed: 1F1B then holds all m at once
    sleepy = nn.Sequential(*[Block(WIDTH, 0) for _ in range(8)])
    held = {}
    for fault in (False, True):
        release = pp.ActivationMeter.release
        if fault:
            pp.ActivationMeter.release = lambda self, key: None  # the fault
        try:
            ok = True
            for sched in (pp.gpipe(2, M), pp.one_f_one_b(2, M)):
                stages = pp.split_by_count(copy.deepcopy(sleepy), 2)
                pipe = pp.Pipeline(stages, sched, F.mse_loss)
                pipe.step(x, y)
                pipe.close()
                ok = ok and pp.held_as_predicted(pipe.meter, sched, rank)
        finally:
            pp.ActivationMeter.release = release
        held[fault] = checks.max_over_ranks(0.0 if ok else 1.0) == 0.0
    lines["held"] = f"held what in_flight predicts on every rank: {held[True]}"
    lines["held, no fault"] = str(held[False])
    return lines


@pytest.fixture(scope="module")
def faulty() -> list[dict[str, str]]:
    return spawn(_faults, 2, timeout=60)


@pytest.mark.controls(
    "05_pipeline",
    r"GPipe and 1F1B held what in_flight predicts on every rank",
    fault="the runner never frees a micro-batch's activations",
)
def test_activations_never_freed_break_the_in_flight_prediction(faulty) -> None:  # noqa: ANN001
    for lines in faulty:
        assert lines["held"].endswith(": False")
        assert lines["held, no fault"] == "True"  # the same run without the fault


@pytest.mark.controls(
    "05_pipeline",
    r"\] (GPipe|1F1B|interleaved 1F1B \(v=2\)|ZB-H1)\s+loss [\d.]+; loss and all",
    fault="micro-batch losses summed, not averaged (gradients m times too large)",
)
@pytest.mark.controls(
    "05_pipeline",
    r"plain (GPipe|1F1B|interleaved 1F1B \(v=2\))\s+loss and all gradients",
    fault="micro-batch losses summed, not averaged (gradients m times too large)",
)
@pytest.mark.controls(
    "05_pipeline",
    r"torch [\w ]+?\s+loss and all gradients",
    fault="micro-batch losses summed, not averaged (gradients m times too large)",
)
def test_summed_micro_batch_losses_fail_every_equivalence(faulty) -> None:  # noqa: ANN001
    names = [
        "GPipe",
        "1F1B",
        "interleaved 1F1B (v=2)",
        "ZB-H1",
        *(f"plain {n}" for n in ("GPipe", "1F1B", "interleaved 1F1B (v=2)")),
        *(f"torch {n}" for n in ON_GLOO),
    ]
    for lines in faulty:
        for name in names:
            assert lines[name].endswith(": FAIL"), (name, lines[name])
