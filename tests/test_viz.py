"""distcourse.viz: every figure builds headless and returns a Figure."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from distcourse import viz  # noqa: E402


def test_rank_tensors_draws_one_labelled_cell_per_value() -> None:
    before = [torch.tensor([1.0, 2.0, 3.0]) * (r + 1) for r in range(3)]
    after = [torch.tensor([6.0, 12.0, 18.0])] * 3
    fig = viz.rank_tensors(before, after, "all_reduce(SUM)")
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    left, right = fig.axes
    assert [t.get_text() for t in right.texts[:3]] == ["6", "12", "18"]
    assert [t.get_text() for t in left.get_yticklabels()][0] == "rank 0"
    assert len(left.patches) == len(right.patches) == 9


def test_rank_tensors_handles_uneven_rows_and_non_integers() -> None:
    fig = viz.rank_tensors([torch.tensor([0.5]), torch.tensor([])], [torch.ones(4)] * 2)
    assert "0.5" in [t.get_text() for t in fig.axes[0].texts]


def test_cost_plot_is_log_log_with_a_line_per_series() -> None:
    sizes = [1e3, 1e4, 1e5]
    fig = viz.cost_plot(
        sizes, {"ring": [1e-4, 2e-4, 1e-3]}, {"ring": [1e-4, 2e-4, 9e-4]}
    )
    ax = fig.axes[0]
    assert isinstance(fig, Figure) and ax.get_xscale() == ax.get_yscale() == "log"
    dots, line = ax.get_lines()
    assert dots.get_color() == line.get_color()  # one colour per algorithm
