"""The global-tensor benchmark runs end to end (quick mode) and reports what it
promises: both sides compute the same result; the ratio is ours / DTensor's."""

from __future__ import annotations

import importlib
import json

import pytest

bench = importlib.import_module("distcourse.bench.global")  # a keyword: no `import`


def test_quick_json_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--quick", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)  # one JSON object, nothing else
    assert report["benchmark"] == "global" and report["ranks"] == 2
    assert report["same_result"] is True
    rows = report["table"]
    assert [r["implementation"] for r in rows] == list(bench.IMPLEMENTATIONS)
    assert all(r["step_ms"] > 0 for r in rows) and report["ratio"] > 0
    assert report["load_average"] >= 0 and report["config"]["steps"] == 3


def test_the_benchmark_is_listed() -> None:
    from distcourse.bench.__main__ import available

    assert "global" in available()
