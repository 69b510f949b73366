"""Scaling benchmark: runs end to end; its speed-ups follow from the times it gives."""

from __future__ import annotations

import pytest

from distcourse import viz
from distcourse.bench import scaling
from distcourse.viz.common import SMALL


def test_summarize_computes_speedups_from_medians() -> None:
    cfg = scaling.Config(global_batch=8, per_rank=2)
    times = {
        1: {"strong": [0.4, 0.4, 0.4], "weak": [0.1, 0.1, 0.1]},
        2: {"strong": [0.2, 0.3, 0.2], "weak": [0.1, 0.2, 0.1]},
    }
    rows = scaling.summarize(times, cfg)
    by = {(r["mode"], r["ranks"]): r for r in rows}
    assert by["strong", 2]["per_rank"] == 4 and by["weak", 2]["global_batch"] == 4
    assert by["strong", 2]["speedup"] == pytest.approx(0.4 / 0.2)
    assert by["weak", 2]["speedup"] == pytest.approx(2 * 0.1 / 0.1)
    assert by["strong", 1]["speedup"] == 1


def test_quick_run_measures_every_mode_and_world() -> None:
    rows = scaling.run(scaling.QUICK)
    assert [(r["mode"], r["ranks"]) for r in rows] == [
        (m, w) for m in scaling.MODES for w in (1, 2, 4)
    ]
    assert all(0 < r["q1_ms"] <= r["median_ms"] <= r["q3_ms"] for r in rows)
    table = scaling.format_table(rows, speedup=False)
    assert "speed-up" not in table and table.count(" ms") == 3 * len(rows)


def test_plot_draws_both_modes() -> None:
    cfg = scaling.Config()
    times = {
        w: {m: [0.01 * w, 0.02 * w, 0.03 * w] for m in scaling.MODES} for w in (1, 2)
    }
    fig = scaling.plot(scaling.summarize(times, cfg))
    assert [ax.get_title() for ax in fig.axes] == [
        "strong scaling: fixed global batch",
        "weak scaling: fixed per-rank batch",
    ]
    # readable where chapter 3b shows it: the full width (viz.figure refuses less)
    shown = viz.figure(fig, "3b.2", "the scaling figure", "two line charts", wide=True)
    assert shown.smallest.points >= SMALL


def test_the_gap_splits_into_work_that_does_not_shrink_and_communication() -> None:
    """2 ranks take 0.3 s a step against an ideal 0.2 (one rank's 0.4 / 2); under
    no_sync 0.25: 0.05 s of the gap is work that does not shrink with the batch,
    0.05 s what communication adds; the all-reduce alone took 0.04."""
    cfg = scaling.Config(global_batch=8, per_rank=2)
    times = {
        1: {"strong": [0.4] * 3, "weak": [0.1] * 3},
        2: {
            "strong": [0.3] * 3,
            "weak": [0.1] * 3,
            "no communication": [0.25] * 3,
            "all-reduce alone": [0.04] * 3,
        },
    }
    got = scaling.gap(scaling.summarize(times, cfg))
    want = dict(
        step=300,
        ideal=200,
        gap=100,
        without_communication=50,
        communication=50,
        all_reduce_alone=40,
    )
    assert got == pytest.approx(want)


def test_a_quick_run_times_the_gaps_parts() -> None:
    rows = scaling.run(scaling.QUICK)
    got = scaling.gap(rows)
    assert got["step"] > 0 and got["all_reduce_alone"] > 0
    assert got["gap"] == pytest.approx(
        got["without_communication"] + got["communication"]
    )
