"""The TP benchmark runs end to end (quick mode) and reports what it promises."""

from __future__ import annotations

import json

import pytest

from distcourse.bench import tp


def test_quick_json_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert tp.main(["--quick", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)  # one JSON object, nothing else
    assert report["benchmark"] == "tp" and report["ranks"] == 2
    rows = report["table"]
    assert [(r["ranks"], r["implementation"]) for r in rows] == [
        (2, name) for name in tp.IMPLEMENTATIONS
    ]
    assert all(r["step_ms"] > 0 for r in rows)
    assert rows[0]["vs_torch"] == 1.0  # torch against itself
    assert report["ratio"] == rows[1]["vs_torch"] > 0
    assert report["unchecked_ratio"] == rows[2]["vs_torch"] > 0
    table = tp.format_table(rows)
    assert "parallelize_module" in table and len(table.splitlines()) == len(rows) + 1


def test_ranks_must_divide_the_hidden_width() -> None:
    with pytest.raises(SystemExit):
        tp.main(["--quick", "--ranks", "3"])
