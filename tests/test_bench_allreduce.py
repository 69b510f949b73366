"""`python -m distcourse.bench allreduce` runs; --json prints one parseable object."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from distcourse.bench import allreduce


def test_quick_json_run_prints_one_object_with_a_ratio() -> None:
    cmd = [sys.executable, "-m", "distcourse.bench", "allreduce", "--quick", "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)  # stdout holds the JSON object and nothing else
    assert report["ratio"] > 0 and report["ranks"] == 4 and report["runs"] == 1
    assert report["ratio_min"] == report["ratio"] == report["ratio_max"]
    assert {(r["ranks"], r["bytes"]) for r in report["rows"]} == {
        (n, s) for n in (2, 4) for s in allreduce.QUICK_SIZES
    }


def test_table_lists_every_row() -> None:
    rows = [
        dict(
            ranks=2,
            bytes=1024,
            torch_gbps=1.0,
            distcourse_gbps=0.5,
            ratio=0.5,
            ratio_min=0.25,
            ratio_max=0.75,
            runs=5,
        )
    ]
    lines = allreduce.table(rows).splitlines()
    assert len(lines) == 2
    want = ["2", "1", "KB", "1.000", "0.500", "0.50", "0.25-0.75", "5"]
    assert lines[1].split() == want


@pytest.mark.parametrize(
    "text, size", [("1K", 1024), ("64M", 64 << 20), ("16MB", 16 << 20), ("100", 100)]
)
def test_parse_size_understands_units(text: str, size: int) -> None:
    assert allreduce.parse_size(text) == size
