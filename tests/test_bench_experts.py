"""The experts benchmark runs end to end (quick mode) and reports what it promises."""

from __future__ import annotations

import json

import pytest

from distcourse.bench import experts


def test_quick_json_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert experts.main(["--quick", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)  # one JSON object, nothing else
    assert report["benchmark"] == "experts" and report["ranks"] == 2
    rows = report["table"]
    assert [r["implementation"] for r in rows] == list(experts.IMPLEMENTATIONS)
    assert all(r["step_ms"] > 0 for r in rows)
    assert report["ratio"] == rows[1]["vs_torch"] > 0 and rows[0]["vs_torch"] == 1
    assert report["torch_moe"].startswith("none")
    table = experts.format_table(rows)
    assert "vs one process" in table and len(table.splitlines()) == len(rows) + 1


def test_ranks_must_divide_the_experts(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        experts.main(["--quick", "--ranks", "3"])
    assert "must divide the 4 experts" in capsys.readouterr().err
