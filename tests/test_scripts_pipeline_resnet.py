"""Chapter 5's ResNet script runs under torchrun (--small) and prints its sweep, as a
table and then as the JSON line the notebook reads (one run: it takes seconds); each
pipelined split is cut where rank 0 measured its stages balanced, the naive one where
the tutorial cuts."""

from __future__ import annotations

import json

from helpers import run_python, torchrun

SWEEP = [(32, 1), (4, 8), (16, 2)]  # naive first; the notebook runs 8 too
PIECES = 6  # stem, 4 one-block layers, head: a cut falls between two of them
LAYER2 = 3  # the tutorial's cut, after the stem, layer1 and layer2


def test_small_resnet_sweep_prints_a_table_and_a_json_line() -> None:
    done = run_python(
        *torchrun(2),
        "book/scripts/pipeline_resnet.py",
        "--small",
        "--json",
        "--splits",
        "4",
        "16",
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0] == (
        "ResNet small: 3 batches of 32 images 128x128, 10 classes, on cpu"
    )
    assert lines[1].startswith("one process ") and lines[1].endswith(" s")
    rows = [line.split() for line in lines[3:-2]]
    assert [(int(r[0]), int(r[1])) for r in rows] == SWEEP
    assert rows[0][4] == "1.00x" and int(rows[0][2]) == LAYER2
    assert all(0 < int(r[2]) < PIECES for r in rows)
    assert lines[-2].startswith("best split size ")
    report = json.loads(lines[-1])
    assert (report["batch"], report["image"], report["batches"]) == (32, 128, 3)
    assert (report["cut"], report["pieces"], report["repeats"]) == ("balanced", 6, 1)
    assert [tuple(row[:2]) for row in report["rows"]] == SWEEP
    assert report["one"] > 0 and all(row[2] > 0 for row in report["rows"])
    # each row: compute per micro-batch on stage 0's rank and stage 1's, in ms
    assert all(len(row[3]) == 2 and min(row[3]) > 0 for row in report["rows"])
