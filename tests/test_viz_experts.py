"""distcourse.viz.experts: the dispatch matrix and its transpose; load per expert."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

from distcourse import viz  # noqa: E402


def test_dispatch_matrix_shows_the_rows_and_the_combine_as_its_transpose() -> None:
    fig = viz.dispatch_matrix([[1, 2], [3, 4]], [[0, 1], [2, 3]])
    dispatch, combine = fig.axes[:2]
    assert [t.get_text() for t in dispatch.texts] == ["1", "2", "3", "4"]
    assert [t.get_text() for t in combine.texts] == ["1", "3", "2", "4"]
    # under a column the experts go on a line of their own (side by side, the
    # labels of 4 ranks overlapped)
    assert dispatch.get_xticklabels()[1].get_text() == "rank 1\nexperts\n2,3"
    assert "experts 2,3" in combine.get_yticklabels()[1].get_text()
    assert dispatch.get_title().startswith("dispatch")


def test_expert_load_stacks_the_dropped_on_the_served() -> None:
    fig = viz.expert_load([5, 1, 2], [3, 1, 2], capacity=3, title="t")
    ax = fig.axes[0]
    heights = [round(p.get_height()) for p in ax.patches]
    assert heights == [3, 1, 2, 2, 0, 0]  # served, then dropped on top
    assert ax.lines[0].get_ydata()[0] == 3 and ax.get_title() == "t"
