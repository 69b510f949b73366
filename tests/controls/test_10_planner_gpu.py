"""Negative controls for chapter 10's real-GPU section: the planner against the H200's
measured steps, one step's memory over time by kind, and the search on one node
above FSDP's rule. Each runs the chapter's check with a fault planted in the planner
and must print FAIL or False."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from distcourse import checks, plan
from distcourse.examples.gpt import GPTConfig
from distcourse.plan import memory as plan_memory
from distcourse.plan import phases
from distcourse.plan import timing as plan_timing

ROWS = json.loads(
    (Path(__file__).parents[1] / "data" / "gpu_measurements.json").read_text()
)["rows"]


def _fails(line: str) -> bool:
    return line.endswith(("FAIL", ": False"))


def _worst(dtype_of: dict[str, str]) -> dict[str, float]:
    """The chapter's table: each row against the planner for an H200, the worst
    relative miss of the peak and of the activations (`dtype_of` maps a row's
    dtype to the policy planned for it)."""
    worst = {"peak": 0.0, "activations": 0.0}
    for r in ROWS:
        policy = plan.DTypePolicy(dtype_of[r["dtype"]], "fp32", r["optimizer"])
        spec = plan.ModelSpec(**r["model"])
        p = plan.predict(
            spec, r["batch"], policy, plan.PlanLayout(), plan.named("h200")
        )
        for key, mine in (("peak", "total"), ("activations", "activations")):
            if r[key]:
                worst[key] = max(worst[key], abs(r[key] / p.memory[mine] - 1))
    return worst


@pytest.mark.controls(
    "10_planner",
    r"every H200 row's peak vs the plan's total, relative",
    fault="a planner without the loss region (the logits and their gradients)",
)
def test_a_plan_without_the_loss_region_misses_the_h200s_peaks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(plan_memory, "loss_bytes", lambda *args: 0)
    worst = _worst({"fp32": "fp32", "amp-bf16": "amp-bf16"})
    verdict = checks.verdict(worst["peak"], 0.1)
    line = f"every H200 row's peak vs the plan's total, relative: {verdict}"
    assert _fails(line), line


@pytest.mark.controls(
    "10_planner",
    r"every H200 row's saved activations vs the plan's, relative",
    fault="bf16 autocast planned as one byte count a value (the bf16 policy)",
)
def test_autocast_planned_as_bf16_misses_its_activations() -> None:
    worst = _worst({"fp32": "fp32", "amp-bf16": "bf16"})
    line = "every H200 row's saved activations vs the plan's, relative: " + (
        checks.verdict(worst["activations"], 0.05)
    )
    assert _fails(line), line


@pytest.mark.controls(
    "10_planner",
    r"each kind's largest and the peak == the planner's",
    fault="a planner without the loss region",
)
def test_a_plan_without_the_loss_region_misses_the_timeline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(plan_memory, "loss_bytes", lambda *args: 0)
    torch.set_num_threads(1)
    small = GPTConfig(vocab=32000, block_size=64, n_layer=2, n_head=4, n_embd=256)
    series, _ = phases.timeline(small, 4, optimizer="adamw-fused")
    cpu = plan.local(0.0, 0.0, 1e9, 2**34, 1)
    fused = plan.DTypePolicy("fp32", "fp32", "adamw-fused")
    spec = plan.ModelSpec.from_config(small)
    p = plan.predict(spec, 4, fused, plan.PlanLayout(), cpu)
    alive = [sum(k[i] for k in series.values()) for i in range(len(series["loss"]))]
    largest = {kind: max(values) for kind, values in series.items()}
    same = [largest[k] == p.memory[k] for k in ("parameters", "gradients")]
    same += [0 <= largest[k] - p.memory[k] <= 4 for k in ("activations", "loss")]
    same.append(abs(max(alive) / p.memory["total"] - 1) <= 1e-3)
    line = f"each kind's largest and the peak == the planner's: {all(same)}"
    assert _fails(line), line


@pytest.mark.controls(
    "10_planner",
    r"fastest is FSDP alone: \w+, its messages hidden",
    fault="a planner that overlaps no data-parallel message with compute",
)
def test_a_plan_that_overlaps_nothing_does_not_pick_fsdp(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for stage, calls in list(plan_timing.DP_COLLECTIVES.items()):
        unhidden = tuple((*call[:3], "none") for call in calls)
        monkeypatch.setitem(plan_timing.DP_COLLECTIVES, stage, unhidden)
    monkeypatch.setattr(
        plan_timing, "KEPT", tuple((*c[:3], "none") for c in plan_timing.KEPT)
    )
    model = plan.ModelSpec.from_params(7e9, seq=1024)
    all_bf16 = plan.DTypePolicy("bf16", "bf16", "adamw")
    best = plan.search(model, 16, all_bf16, plan.named("h100"), 8)[0]
    fsdp = best.layout.zero == 3 and best.layout.gpus == best.layout.dp
    hidden = best.time["dp"] == 0 < best.messages["dp"]
    line = (
        f"8 GPUs, 2,048 tokens a rank: fastest is FSDP alone: {fsdp}, "
        f"its messages hidden: {hidden}"
    )
    assert _fails(line), line
