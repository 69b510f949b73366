"""The hybrid benchmark runs end to end (quick mode) and reports what it promises."""

from __future__ import annotations

import dataclasses
import json

import pytest

from distcourse.bench import hybrid
from distcourse.parallel.hybrid import Layout, memory_per_rank


def test_quick_json_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert hybrid.main(["--quick", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)  # one JSON object, nothing else
    assert report["benchmark"] == "hybrid" and report["ranks"] == 4
    rows = report["table"]
    assert [r["layout"] for r in rows] == [
        "4x1x1",
        "2x2x1",
        "2x1x2",
        "1x4x1",
        "1x2x2",
        "1x1x4",
    ]
    assert all(r["step_ms"] > 0 and r["activations_kib"] > 0 for r in rows)
    assert [r["micro_batches"] for r in rows] == [1, 4, 1, 8, 4, 1]  # 2 per stage
    best = min(rows, key=lambda r: r["step_ms"])
    assert report["best"] == best["layout"]
    assert report["ratio"] == round(best["step_ms"] / rows[0]["step_ms"], 3)
    gpt = hybrid.QUICK.gpt()
    for r in rows:  # model state: the largest stage's formula, activations apart
        layout = Layout(r["dp"], r["pp"], r["tp"])
        state = max(memory_per_rank(layout, gpt, s) for s in range(layout.pp))
        assert r["memory_kib"] > state / 1024
        rank_state = r["memory_kib"] - r["activations_kib"]  # the fullest rank's
        assert rank_state <= state / 1024 + 0.1  # KiB rounded to 0.1
        assert any(
            abs(rank_state - memory_per_rank(layout, gpt, s) / 1024) <= 0.1
            for s in range(layout.pp)
        )
    table = hybrid.format_table(rows)
    assert "dp x pp x tp" in table and len(table.splitlines()) == len(rows) + 1


def test_micro_batches_per_stage() -> None:
    layouts = [Layout(8), Layout(4, 2), Layout(1, 8), Layout(2, 2, 2)]
    assert [hybrid.micro_batches(lay) for lay in layouts] == [1, 4, 16, 4]
    assert [hybrid.micro_batches(lay, 1) for lay in layouts] == [1, 2, 8, 2]
    assert hybrid.Config(8, 8, 8, 16, 8, 16, 1, 1).per_stage == 2  # the default


def test_only_some_layouts() -> None:
    cfg = hybrid.Config(8, 8, 8, 16, 8, 16, 1, 1, only=("1x1x8", "8x1x1"))
    assert [lay.name for lay in hybrid.chosen(cfg)] == ["8x1x1", "1x1x8"]
    assert len(hybrid.chosen(hybrid.QUICK)) == 6  # () is every layout
    with pytest.raises(ValueError, match="no layout of 8 ranks is named 3x1x1"):
        hybrid.measure(dataclasses.replace(cfg, only=("2x2x2", "3x1x1")))
    with pytest.raises(ValueError, match="needs pure data parallelism, 8x1x1"):
        hybrid.run(dataclasses.replace(cfg, only=("1x1x8",)))  # before any rank


def test_across_runs_gives_medians_and_the_order() -> None:
    def result(times: dict[str, float], best: str) -> dict:
        table = [
            dict(layout=name, step_ms=t, memory_kib=1.0) for name, t in times.items()
        ]
        return dict(ranks=2, best=best, table=table)

    runs = [
        result({"2x1x1": 10.0, "1x2x1": 30.0, "1x1x2": 50.0}, "2x1x1"),
        result({"2x1x1": 40.0, "1x2x1": 20.0, "1x1x2": 60.0}, "1x2x1"),
        result({"2x1x1": 20.0, "1x2x1": 25.0, "1x1x2": 70.0}, "2x1x1"),
    ]
    lines = hybrid.across_runs(runs)
    assert lines[1].split() == [
        "2x1x1",
        "10",
        "ms",
        "40",
        "ms",
        "20",
        "ms",
        "20",
        "ms",
        "1",
    ]
    assert lines[-3] == "fastest in each run: 2x1x1, 1x2x1, 2x1x1"
    assert (
        lines[-2]
        == "by median: fastest 2x1x1, then 1x2x1; slowest 1x1x2, 3.0 x the fastest"
    )
    assert lines[-1] == "median step as tp doubles (2x1x1, 1x1x2): 20 ms, 60 ms"
