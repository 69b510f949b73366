"""The numbers book/10b_planner_page.md states in its prose are `distcourse.plan`'s:
each is computed here and must appear in the page as written (the page's form is
held to the package by tests/test_book_browser_planner.py)."""

from __future__ import annotations

import json
from pathlib import Path

from distcourse import plan

PAGE = Path(__file__).parent.parent / "book" / "10b_planner_page.md"
ROWS = Path(__file__).parent / "data" / "gpu_measurements.json"
SEVEN_B = plan.ModelSpec.from_params(7e9)
BF16 = plan.DTypePolicy("bf16", "bf16")
H100 = plan.named("h100")


def dp8(**fields: object) -> plan.Prediction:
    """The page's example: 7B on 8 H100s, batch 64, bf16 with bf16 reductions."""
    return plan.predict(SEVEN_B, 64, BF16, plan.PlanLayout(dp=8, **fields), H100)


def stated() -> dict[str, str]:
    """What the prose says, each number as the page writes it."""
    zero2, zero2_m8 = dp8(zero=2), dp8(zero=2, micro_batches=8)
    zero1, zero1_m8 = dp8(zero=1), dp8(zero=1, micro_batches=8)
    zero3_m8 = dp8(zero=3, micro_batches=8)
    kept = dp8(zero=3, micro_batches=8, reshard=False)
    assert zero1.messages["dp"] == zero1_m8.messages["dp"] == zero2.messages["dp"]
    assert zero3_m8.time["dp"] == kept.time["dp"] == 0.0  # hidden by the compute
    assert zero1.time["dp"] == zero2_m8.time["dp"]  # the all-gather after the step
    rows = [r for r in json.loads(ROWS.read_text())["rows"] if r["activations"]]
    amp, fp32 = (
        next(r["activations"] for r in rows if r["dtype"] == d)
        for d in ("amp-bf16", "fp32")
    )
    weights = SEVEN_B.params * BF16.weight_bytes
    return {
        "ZeRO-2 at m = 1": f"{zero2.messages['dp']:.3g} s at m = 1",
        "ZeRO-2 at m = 8": f"{zero2_m8.messages['dp']:.3g} s at m = 8",
        "ZeRO-1": f"ZeRO-1's {zero1.messages['dp']:.3g} s",
        "ZeRO-3 at m = 8": f"ZeRO-3's {zero3_m8.messages['dp']:.3g} s at m = 8",
        "the all-gather after the step": f"after the step, {zero1.time['dp']:.3g} s",
        "tokens a micro-batch": f"with {SEVEN_B.seq} tokens a micro-batch",
        "kept gathered": f"{kept.messages['dp']:.3g} s of messages",
        "bf16 weights": f"all {weights / 2**30:.1f} GiB of bf16 weights",
        "autocast's activations": f"come to {amp / fp32:.2f} of fp32's",
    }


def test_the_pages_numbers_are_the_planners() -> None:
    page = " ".join(PAGE.read_text().split())  # the prose's line breaks aside
    missing = {what: text for what, text in stated().items() if text not in page}
    assert not missing, missing


def test_the_accumulation_buffer_makes_the_playbooks_20_bytes() -> None:
    """'2 + 2 + 12 + 4 = 20 bytes a parameter' under DP with m > 1 in bf16."""
    layout = plan.PlanLayout(dp=8, micro_batches=8, bucket_view=True)
    held = plan.rank_memory(SEVEN_B, 64, BF16, layout, 0)
    steps = 4 * (16 * SEVEN_B.layers + 5)
    state = held["parameters"] + held["gradients"] + held["optimizer"] - steps
    assert (state + held["buffers"]) / SEVEN_B.params == 20
    assert "2 + 2 + 12 + 4 = 20" in " ".join(PAGE.read_text().split())
