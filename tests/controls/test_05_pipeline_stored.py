"""Negative control for chapter 5's step 0 verdict (issue 52: judged on a stored run).

The chapter prints `best pipelined split S (m micro-batches): X.XXx the naive split,
at least 1.2x: PASS` from the run stored in book/measurements/ch05_split.json
(`bench.resnet.verdict`, on the medians of the script's timed runs). Here the same
script runs with its pipeline swapped for one whose stages take turns: each rank
runs a micro-batch's forward and then its backward before the next forward, so rank
0's next forward waits for rank 1's backward and the two never compute at once.
Whatever the machine, that is no faster than the naive split: the verdict fails. A
run stored under load fails too, whatever it measured.
"""

from __future__ import annotations

import pytest

from distcourse.bench import record, resnet

PIPELINE = (
    "    pipe = pp.Pipeline(stages, pp.gpipe(2, batch // split), F.mse_loss, "
    "timeout=300)"
)
TAKING_TURNS = (  # rank r: F r.0, B r.0, F r.1, B r.1, ...: a valid, serial schedule
    "    pipe = pp.Pipeline(stages, pp.Schedule('turns', 2, batch // split, 1, "
    "tuple(tuple(pp.Action(k, r, j) for j in range(batch // split) for k in 'FB') "
    "for r in (0, 1))), F.mse_loss, timeout=300)"
)


@pytest.mark.controls(
    "05_pipeline",
    r"best pipelined split \d+ \(\d+ micro-batches\): .* at least 1\.2x",
    fault="a pipeline whose stages take turns (each forward after the previous "
    "micro-batch's backward), run as the chapter's script; a run stored under load",
    printed_on="a stored quiet run (book/measurements/ch05_split.json)",
)
def test_a_pipeline_whose_stages_take_turns_fails() -> None:
    data = resnet.run(repeats=1, swap=(PIPELINE, TAKING_TURNS), splits=(8, 16))
    planted = record.Stored(resnet.NAME, data, {"quiet": True})
    assert resnet.verdict(planted).endswith(": FAIL"), resnet.table(data)
    stored = record.load(resnet.NAME)
    if stored is not None:  # as written: the run stored with the book passes
        assert resnet.verdict(stored).endswith(": PASS")
        busy = record.Stored(resnet.NAME, stored.data, {"quiet": False})
        assert resnet.verdict(busy).endswith(": FAIL")
