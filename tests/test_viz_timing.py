"""distcourse.viz.timing: cost curves, timelines, sweeps, Gantt charts, headless."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from distcourse import viz  # noqa: E402


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
