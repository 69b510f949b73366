"""The DDP benchmark runs end to end (quick mode) and reports what it promises."""

from __future__ import annotations

import json

import pytest

from distcourse.bench import ddp


def test_quick_json_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert ddp.main(["--quick", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)  # one JSON object, nothing else
    assert report["benchmark"] == "ddp"
    rows = report["table"]
    assert {(r["ranks"], r["implementation"]) for r in rows} == {
        (w, name) for w in (2, 4) for name in ddp.IMPLEMENTATIONS
    }
    assert all(r["step_ms"] > 0 for r in rows)
    ours = [r for r in rows if r["ranks"] == 4 and r["implementation"] == "ours (DDP)"]
    assert report["ratio"] == ours[0]["vs_torch"] > 0
    table = ddp.format_table(rows)
    assert "torch DDP" in table and len(table.splitlines()) == len(rows) + 1
