"""Scaling benchmark: runs end to end; its speed-ups follow from the times it gives."""

from __future__ import annotations

import pytest

from distcourse.bench import scaling


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
