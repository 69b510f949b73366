"""Chapter 5's ResNet script runs under torchrun (--small) and prints its sweep."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from helpers import torchrun

ROOT = Path(__file__).resolve().parents[1]


def test_small_resnet_sweep_runs_on_two_ranks() -> None:
    done = subprocess.run(
        [
            sys.executable,
            *torchrun(2),
            "book/scripts/pipeline_resnet.py",
            "--small",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1", "DISTCOURSE_DEVICE": "cpu"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "ResNet small: 3 batches of 24 images 32x32, 10 classes, on cpu"
    assert lines[1].startswith("one process ") and lines[1].endswith(" s")
    rows = [line.split() for line in lines[3:-1]]
    # the naive split (the whole batch, m = 1) first, then the sweep
    assert [(int(r[0]), int(r[1])) for r in rows] == [
        (24, 1),
        (2, 12),
        (4, 6),
        (6, 4),
        (12, 2),
    ]
    assert rows[0][3] == "1.00x"
    assert lines[-1].startswith("best split size ")


def test_small_resnet_sweep_as_json_for_the_notebook() -> None:
    done = subprocess.run(
        [
            sys.executable,
            *torchrun(2),
            "book/scripts/pipeline_resnet.py",
            "--small",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1", "DISTCOURSE_DEVICE": "cpu"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert (report["batch"], report["image"], report["batches"]) == (24, 32, 3)
    assert [row[:2] for row in report["rows"]] == [
        [24, 1],
        [2, 12],
        [4, 6],
        [6, 4],
        [12, 2],
    ]
    assert report["one"] > 0 and all(row[2] > 0 for row in report["rows"])
