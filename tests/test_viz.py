"""distcourse.viz: every figure builds headless and returns a Figure."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
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


def test_cost_plot_draws_the_spread_of_repeats_as_bars() -> None:
    runs = [[1e-4, 3e-4], [2e-4, 2e-4], [1e-3, 5e-3]]  # sorted repeats per size
    fig = viz.cost_plot([1e3, 1e4, 1e5], {"tree": runs}, {"tree": [1e-4, 2e-4, 1e-3]})
    ax = fig.axes[0]
    (bars,) = ax.collections
    assert len(bars.get_segments()) == 3
    assert list(ax.get_lines()[0].get_ydata()) == [1e-4, 2e-4, 1e-3]  # the fastest


def test_timeline_puts_compute_on_top_and_one_row_per_bucket() -> None:
    from distcourse.trace import Event

    events = [
        Event("forward", 10.000, 10.001),
        Event("all_reduce 0", 10.002, 10.004),
        Event("all_reduce 1", 10.0025, 10.005),
        Event("backward", 10.0015, 10.003),
        ("wait", 10.003, 10.005),  # tuples work too
    ]
    fig = viz.timeline(events, "one step")
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == ["compute", "all_reduce 0", "all_reduce 1"]
    bars = sorted((round(p.get_x(), 6), round(p.get_width(), 6)) for p in ax.patches)
    assert bars == [(0.0, 1.0), (1.5, 1.5), (2.0, 2.0), (2.5, 2.5), (3.0, 2.0)]
    assert ax.yaxis_inverted()  # compute on top
    (line,) = ax.get_lines()  # end of backward
    assert line.get_xdata()[0] == pytest.approx(3.0)
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["forward", "backward", "wait", "all_reduce"]  # fixed order


def test_hidden_sweep_draws_median_and_range_in_percent_on_a_log_axis() -> None:
    shares = [[0.2, 0.5, 0.4], [0.0, 0.0, 0.0]]
    fig = viz.hidden_sweep([0.25, 4.0], shares, "wide_mlp")
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_ylim() == (0, 100)
    medians = ax.get_lines()[0]
    assert list(medians.get_ydata()) == pytest.approx([40.0, 0.0])
    bars = ax.collections[0].get_segments()  # one vertical bar per cap
    ends = [float(y) for seg in bars for y in seg[:, 1]]
    assert ends == pytest.approx([20, 50, 0, 0])


def test_tp_layout_colours_one_block_per_rank_where_a_tensor_is_split() -> None:
    fig = viz.tp_layout(4, title="4 ranks")
    assert isinstance(fig, Figure) and len(fig.axes) == 6
    blocks = [len(ax.patches) for ax in fig.axes]
    assert blocks == [1, 4, 4, 4, 4, 1]  # X whole; W, Y split; row: X, W split; sum
    labels = [t.get_text() for t in fig.axes[1].texts]
    assert labels == [f"rank\n{r}" for r in range(4)]
    assert fig.axes[0].get_ylabel() == "column-parallel"
    col_y, row_y = fig.axes[2].patches, fig.axes[4].patches
    assert col_y[1].get_x() == 2 and col_y[1].get_width() == 2  # columns of Y
    assert row_y[0].get_height() == 8 and row_y[3].get_x() == 6  # columns of W


def test_tp_layout_rejects_no_ranks() -> None:
    with pytest.raises(ValueError, match="positive number of ranks"):
        viz.tp_layout(0)


def test_gantt_draws_a_row_per_rank_and_a_bar_per_action() -> None:
    events = [
        [("F 0 0", 0.0, 0.001), ("F 0 1", 0.001, 0.002), ("B 0 0", 0.004, 0.006)],
        [("F 1 0", 0.001, 0.002), ("B 1 0", 0.002, 0.004)],
    ]
    fig = viz.gantt(events, title="1F1B")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 0", "rank 1"]
    bars = ax.patches
    assert len(bars) == 5
    assert [round(b.get_width(), 6) for b in bars] == [1.0, 1.0, 2.0, 1.0, 2.0]
    assert [round(b.get_x(), 6) for b in bars] == [0.0, 1.0, 4.0, 1.0, 2.0]
    assert [t.get_text() for t in ax.texts] == ["0", "1", "0", "0", "0"]


def test_sbp_pieces_draws_a_panel_per_rank_and_signature() -> None:
    whole = torch.arange(16.0).reshape(4, 4)
    pieces = {"S(0)": list(whole.tensor_split(4)), "P": [whole] + [whole * 0] * 3,
              "S(1) of 6": [torch.ones(2, 1), torch.ones(2, 0)] * 2}  # fmt: skip
    fig = viz.sbp_pieces(pieces, "one tensor")
    assert len(fig.axes) == 12 and fig.axes[0].get_ylabel() == "S(0)"
    assert [t.get_text() for t in fig.axes[1].texts] == ["4", "5", "6", "7"]
    assert fig.axes[4].get_title() == "rank 0: (4, 4)" and len(fig.axes[4].texts) == 16
    assert len(fig.axes[9].images) == 0  # an empty piece draws nothing


def test_sbp_pieces_rejects_no_ranks() -> None:
    with pytest.raises(ValueError, match="one rank"):
        viz.sbp_pieces({"B": []})
