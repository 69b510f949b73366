"""distcourse.viz.mesh: the mesh with its groups per axis, bytes per axis, headless."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from distcourse import viz  # noqa: E402
from distcourse.viz.mesh import groups_of  # noqa: E402


def test_groups_follow_the_grid_with_tp_innermost() -> None:
    shape = (2, 2, 2)
    assert groups_of(shape, 2) == [[0, 1], [2, 3], [4, 5], [6, 7]]  # tp
    assert groups_of(shape, 1) == [[0, 2], [1, 3], [4, 6], [5, 7]]  # pp
    assert groups_of(shape, 0) == [[0, 4], [1, 5], [2, 6], [3, 7]]  # dp


def test_mesh_groups_draws_a_panel_per_axis_a_box_per_rank_a_line_per_group() -> None:
    fig = viz.mesh_groups((2, 2, 2), ("dp", "pp", "tp"))
    assert len(fig.axes) == 3
    for ax, name in zip(fig.axes, ("dp", "pp", "tp"), strict=True):
        texts = [t.get_text() for t in ax.texts]
        assert texts[5] == "5\n(1, 0, 1)"  # rank 5 sits at dp=1, pp=0, tp=1
        assert len(ax.get_lines()) == 4  # 4 groups of 2 along every axis
        assert ax.get_title() == f"{name}: 4 groups of 2"
    for line in fig.axes[2].get_lines():  # a tp group: two ranks of one row,
        ys = list(line.get_ydata())  # joined over their boxes, whose sides almost
        assert ys[0] == ys[-1] < max(ys)  # touch (a straight line hid behind them)
    for line in fig.axes[1].get_lines():  # a pp group: straight down a column
        assert len(set(line.get_xdata())) == 1


def test_groups_reported_by_the_ranks_are_drawn_as_given() -> None:
    fig = viz.mesh_groups((2, 2), ("dp", "tp"), groups={"tp": [[0, 1, 2, 3]]})
    assert fig.axes[1].get_title() == "tp: 1 group of 4"
    assert len(fig.axes[1].get_lines()) == 1


def test_mesh_groups_refuses_a_name_per_degree_mismatch() -> None:
    with pytest.raises(ValueError, match="one name each"):
        viz.mesh_groups((2, 2), ("dp",))


def test_axis_bytes_stacks_axes_and_marks_the_formula() -> None:
    measured = {"2x1x2": {"dp": 2048, "tp": 1024}, "2x2x1": {"dp": 1024, "pp": 512}}
    fig = viz.axis_bytes(measured, measured)
    ax = fig.axes[0]
    assert len(ax.patches) == 2 * 3  # 2 bars x 3 axes (a missing axis: height 0)
    heights = sorted(p.get_height() for p in ax.patches)
    assert heights == [0, 0, 0.5, 1, 1, 2]  # KiB
    tops = ax.collections[-2].get_offsets()[:, 1].tolist()  # after the last axis
    assert tops == [3.0, 1.5]
    legend = {t.get_text() for t in ax.get_legend().get_texts()}
    assert legend == {"dp", "tp", "pp", "formula"}


def test_layout_costs_marks_the_fastest_and_stacks_memory() -> None:
    rows = [
        dict(layout="2x1x1", step_ms=3.0, memory_kib=10.0, activations_kib=4.0),
        dict(layout="1x2x1", step_ms=2.0, memory_kib=6.0, activations_kib=1.0),
        dict(layout="1x1x2", step_ms=5.0, memory_kib=8.0, activations_kib=6.0),
    ]
    fig = viz.layout_costs(rows)
    left, right = fig.axes
    assert [p.get_height() for p in left.patches] == [3.0, 2.0, 5.0]
    colors = [p.get_facecolor() for p in left.patches]
    assert colors[1] != colors[0] == colors[2]  # the fastest stands out
    tops = [p.get_y() + p.get_height() for p in right.patches[3:]]
    assert tops == [10.0, 6.0, 8.0]  # state + activations = the rank's memory
