"""distcourse.viz.memory: loss curves side by side; memory stacked by kind; one
step's memory over time by kind."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

from distcourse import viz  # noqa: E402


def test_loss_curves_draws_a_labelled_line_per_run() -> None:
    fig = viz.loss_curves({"fp32": [3.0, 2.0, 1.0], "bf16": [3.0, 2.1, 1.1]}, "t")
    ax = fig.axes[0]
    assert [line.get_label() for line in ax.lines] == ["fp32", "bf16"]
    assert list(ax.lines[1].get_ydata()) == [3.0, 2.1, 1.1]
    assert ax.get_title() == "t"


def test_memory_stacks_puts_each_kind_on_the_one_below() -> None:
    bars = {"a": {"weights": 2, "optimizer": 12}, "b": {"weights": 4, "optimizer": 8}}
    fig = viz.memory_stacks(bars, limit=10)
    ax = fig.axes[0]
    heights = [(p.get_y(), p.get_height()) for p in ax.patches]
    assert heights == [(0, 2), (0, 4), (2, 12), (4, 8)]
    assert len(ax.lines) == 1  # the limit


def test_memory_timeline_stacks_the_kinds_and_marks_phases_and_moments() -> None:
    series = {"parameters": [4, 4, 4], "activations": [0, 3, 1], "loss": [0, 2, 0]}
    fig = viz.memory_timeline(series, {"forward": 10, "step": 12}, {"loss": 9}, "B", 1)
    ax = fig.axes[0]
    assert [c.get_label() for c in ax.collections] == list(series)
    tops = ax.collections[-1].get_paths()[0].vertices[:, 1].max()
    assert tops == 9  # 4 + 3 + 2, the step's largest
    alive, *phases, moment = ax.lines
    assert list(alive.get_ydata()) == [4, 9, 5]  # the sum, a line on top
    assert [line.get_xdata()[0] for line in phases] == [0, 2]  # from the first
    assert moment.get_ydata()[0] == 9  # the planner's moment
