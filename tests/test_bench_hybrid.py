"""The hybrid benchmark runs end to end (quick mode) and reports what it promises."""

from __future__ import annotations

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
        "4x1x1", "2x2x1", "2x1x2", "1x4x1", "1x2x2", "1x1x4"
    ]  # fmt: skip
    assert all(r["step_ms"] > 0 and r["activations_kib"] > 0 for r in rows)
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
