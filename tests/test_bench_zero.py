"""The ZeRO benchmark runs end to end (quick mode) and reports what it promises."""

from __future__ import annotations

import json

import pytest

from distcourse.bench import zero


def test_quick_json_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert zero.main(["--quick", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)  # one JSON object, nothing else
    assert report["benchmark"] == "zero" and report["ranks"] == 4
    rows = report["table"]
    assert {(r["ranks"], r["implementation"]) for r in rows} == {
        (w, name) for w in (2, 4) for name in zero.IMPLEMENTATIONS
    }
    assert all(r["step_ms"] > 0 and r["held_bytes"] > 0 for r in rows)
    assert report["ratio"] == max(report["zero1_ratio"], report["fsdp_ratio"]) > 0
    by_name = {r["implementation"]: r for r in rows if r["ranks"] == 4}
    assert report["fsdp_ratio"] == by_name["ours (FSDP)"]["vs_torch"]
    # the same model state per rank: ours and torch's hold the same bytes
    assert by_name["ours (FSDP)"]["held_bytes"] == by_name["torch FSDP2"]["held_bytes"]
    table = zero.format_table(rows)
    assert "held bytes" in table and len(table.splitlines()) == len(rows) + 1
