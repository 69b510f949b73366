"""distcourse.viz.sharding: who holds what per ZeRO stage; memory against bytes."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

from distcourse import viz  # noqa: E402


def test_who_holds_draws_a_panel_per_stage_and_slices_what_is_sharded() -> None:
    fig = viz.who_holds(4)
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == list(viz.sharding.STAGES)
    dp, zero3 = fig.axes[0], fig.axes[3]
    assert {round(p.get_width(), 3) for p in dp.patches} == {1.0, 2.0}  # all whole
    sliced = [p for p in zero3.patches if p.get_fill()]
    assert {round(p.get_width(), 3) for p in sliced} == {0.25, 0.5}  # 1/4 slices
    lefts = sorted(p.get_x() for p in sliced if round(p.get_width(), 3) == 0.25)
    assert len(set(lefts)) == 8  # each rank's slice sits in its own place


def test_memory_for_communication_puts_a_labelled_point_per_strategy() -> None:
    fig = viz.memory_for_communication(["DP", "FSDP"], [16, 4], [8, 12], "t")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.texts] == ["DP", "FSDP"]
    assert ax.get_title() == "t" and len(ax.collections) == 2


def test_bytes_against_ranks_draws_a_formula_line_and_measured_dots() -> None:
    formula = {"DP": [16, 16, 16], "ZeRO-3": [16, 8, 4]}
    fig = viz.bytes_against_ranks([1, 2, 4], formula, formula, "t")
    ax = fig.axes[0]
    assert [list(line.get_ydata()) for line in ax.lines] == list(formula.values())
    assert len(ax.collections) == 2 and ax.get_title() == "t"
