"""Negative controls for chapter 13's verdicts: the same checks, on planted faults.

One spawn of 4 ranks (the chapter's count and layout, 1x2x2 m2) reruns, each with
a fault planted in the code it checks:

- `cli.compare` (against one process) with TP's f missing its backward all-reduce
  (`edges.f` the identity: Megatron's f, forgotten);
- the run's loss drop with a warm-up schedule stuck at 0 (the rate never rises);
- a resume that leaves AdamW's moments out (`state.set_moments` a no-op), on the
  same layout and on another (4x1x1 here, the chapter's 2 ranks' 2x1x1 cut);
- the planner beside the measured step, with the planner wrong three ways.

The kill drill's verdict runs the script under torchrun with the kill disarmed
(`fault.kill_in_forward` a no-op, planted in a copy of the script).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from helpers import planted

from distcourse import checks, plan
from distcourse.launch import spawn
from distcourse.launch.script import run_torchrun
from distcourse.parallel.tensor import edges
from distcourse.plan import memory as plan_memory
from distcourse.plan import prediction as plan_prediction
from distcourse.train import Corpus, RunConfig, Trainer, TrainLayout, cli
from distcourse.train import state as train_state
from distcourse.train import trainer as train_trainer

LAYOUT = TrainLayout(dp=1, pp=2, tp=2, micro_batches=2)  # the chapter's
ROOT = Path(__file__).resolve().parents[2]


def _resumed(run: RunConfig, corpus: Corpus, other: TrainLayout, work: str) -> list:
    """Losses of steps 1..8: saved after 4 on LAYOUT, resumed on `other` with
    AdamW's moments left out (the chapter's 8 and 24: the same check, shorter)."""
    first = Trainer(LAYOUT, replace(run, ckpt_dir=work), corpus)
    first.fit(until=4)
    first.save()
    first.close()
    with planted(train_state, "set_moments", lambda *a: None):
        second = Trainer(other, replace(run, ckpt_dir=work), corpus)
    losses = second.fit(until=8)
    second.close()
    return losses


def _faults(work: str) -> dict[str, Any]:
    """Each fault's lines or numbers, as the chapter computes them, on this rank."""
    torch.set_num_threads(1)
    corpus, run = Corpus.excerpt(), RunConfig(steps=8, ckpt_every=0)
    found: dict[str, Any] = {}
    with planted(edges, "f", lambda x, group: x):
        lines = cli.compare(LAYOUT, replace(run, steps=3), corpus)
    found["compare"] = [line for line in lines if "vs one process" in line]
    with planted(train_trainer, "warmup_factor", lambda warmup: lambda s: 0.0):
        stuck = Trainer(LAYOUT, run, corpus)
        losses = stuck.fit(until=32)  # the chapter's 32 steps
        stuck.close()
    found["drop"] = losses[0] - losses[-1] > 1
    trainer = Trainer(LAYOUT, run, corpus)
    uninterrupted = trainer.fit(until=8)
    x, y = corpus.batch(8, run.batch, run.seq)
    trainer.net.step(x, y, ledger=True)
    found["sent"], found["held"] = trainer.net.bytes, trainer.net.held()
    found["tensors"] = len(list(trainer.net.module.parameters()))
    trainer.close()
    for name, other in (("same", LAYOUT), ("other", TrainLayout(dp=4))):
        folder = [f"{work}/{name}" if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(folder)
        resumed = _resumed(run, corpus, other, folder[0])
        found[name] = max(
            abs(a - b) for a, b in zip(resumed[4:], uninterrupted[4:], strict=True)
        )
    return found


@pytest.fixture(scope="module")
def found(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Rank 0's results for every fault (one spawn for the whole file)."""
    work = str(tmp_path_factory.mktemp("ch13"))
    return spawn(_faults, 4, work, timeout=180)[0]


@pytest.mark.controls(
    "13_trainer",
    r"1x2x2 m2 1f1b: (gradients of step 1|losses of 3 (sgd|adamw) steps) vs one",
    fault="TP's f without its backward all-reduce (edges.f the identity)",
)
def test_compare_with_tp_missing_its_backward_all_reduce_fails(found: dict) -> None:
    assert len(found["compare"]) == 4
    assert all(line.endswith("FAIL") for line in found["compare"]), found["compare"]


@pytest.mark.controls(
    "13_trainer",
    r"loss of step 32 below step 1's by more than 1 nat",
    fault="the warm-up schedule stuck at 0: the rate never rises",
)
def test_a_run_that_never_steps_does_not_learn(found: dict) -> None:
    assert found["drop"] is False


@pytest.mark.controls(
    "13_trainer",
    r"losses of steps 1-24, killed and resumed vs uninterrupted",
    fault="the resume leaves AdamW's moments out (state.set_moments a no-op)",
)
def test_a_resume_without_adams_moments_fails(found: dict) -> None:
    assert checks.verdict(found["same"], 1e-6).endswith("FAIL"), found["same"]


@pytest.mark.controls(
    "13_trainer",
    r"losses of steps 25-32 on 2 ranks vs 4",
    fault="the resume on another layout leaves AdamW's moments out",
)
def test_a_resume_on_another_layout_without_moments_fails(found: dict) -> None:
    assert checks.verdict(found["other"], 1e-5).endswith("FAIL"), found["other"]


def _predicted() -> plan.Prediction:
    corpus, run = Corpus.excerpt(), RunConfig()
    spec = plan.PlanLayout(dp=1, pp=2, tp=2, micro_batches=2)
    fp32 = plan.DTypePolicy("fp32", "fp32", "adamw")
    model = plan.ModelSpec.from_config(run.model(corpus))
    return plan.predict(model, run.batch, fp32, spec, plan.named("h100"))


def _ignoring_tp(real: Callable) -> Callable:
    return lambda model, layout, stage: real(model, replace(layout, tp=1), stage)


def _one_direction(real: Callable) -> Callable:
    def step_time(*args: Any) -> tuple:
        seconds, wire, flops = real(*args)
        return seconds, {**wire, "pp": wire["pp"] // 2}, flops

    return step_time


@pytest.mark.controls(
    "13_trainer",
    r"parameters, gradients, activations == the plan's",
    fault="the planner's stage_params ignores TP: every rank holds whole matrices",
)
@pytest.mark.controls(
    "13_trainer",
    r"optimizer: the plan also counts AdamW's step counters",
    fault="the planner's stage_tensors forgets the embeddings' and head's tensors",
)
@pytest.mark.controls(
    "13_trainer",
    r"wire bytes of every axis == the plan's",
    fault="the plan's pp bytes count one direction only (the gradients' sends)",
)
def test_a_wrong_planner_disagrees_with_the_run(found: dict) -> None:
    held, sent = found["held"], found["sent"]
    assert _predicted().memory["parameters"] == held["params"]  # rank 0, fullest
    blocks = lambda model, layout, stage: 16 * (model.layers // layout.pp)  # noqa: E731
    with planted(plan_memory, "stage_params", _ignoring_tp(plan_memory.stage_params)):
        assert _predicted().memory["parameters"] != held["params"]
    with planted(plan_memory, "stage_tensors", blocks):
        counters = _predicted().memory["optimizer"] - held["optimizer"]
        assert counters != 4 * found["tensors"], counters
    real = plan_prediction.step_time
    with planted(plan_prediction, "step_time", _one_direction(real)):
        assert _predicted().wire["pp"] != sent["pp"]


@pytest.mark.controls(
    "13_trainer",
    r"torchrun saw rank 1 die by SIGKILL and restarted the group",
    fault="the kill disarmed (fault.kill_in_forward a no-op): no rank dies",
)
def test_a_drill_whose_rank_does_not_die_is_seen(tmp_path: Path) -> None:
    script = tmp_path / "train_gpt_disarmed.py"
    script.write_text(
        "from distcourse.train import cli, fault\n"
        "fault.kill_in_forward = lambda module: None  # the planted fault\n"
        "cli.main()\n"
    )
    small = ["--layers", "2", "--batch", "4", "--seq", "16", "--quiet", "--excerpt"]
    drill = run_torchrun(
        script,
        *small,
        *("--pp", "2", "--micro-batches", "2", "--steps", "4", "--ckpt-every", "2"),
        *("--ckpt-dir", str(tmp_path / "ckpt"), "--kill", "1:3"),
        ranks=2,
        max_restarts=1,
        env={"DISTCOURSE_DEVICE": "cpu"},
    )
    died = re.search(r"exitcode: -9\) local_rank: 1\b", drill.stderr) is not None
    assert died is False
    assert "steps 1-4" in drill.stdout  # one attempt, nothing restarted
