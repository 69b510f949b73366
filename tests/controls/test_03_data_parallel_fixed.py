"""Negative controls for chapter 3's overlap verdict (issue 52: judged on a stored run).

The chapter prints `best bucket size ... MB: median hidden share ... of N rank-steps,
at least 0.5: PASS` from the run stored in book/measurements/ch03_overlap.json
(`bench.overlap.verdict`: the median of `trace.hidden_fraction` over ranks and steps,
at the cap where it is largest). Here the same measurement runs on a real DDP that
puts every gradient in one bucket, whatever the cap, so its one all-reduce is
launched at the last gradient: it scores 0 at every cap and fails, on any machine.
A run stored under load fails too, whatever it measured; planted timelines of a DDP
that sends after backward, or whose early launches sit in a queue until backward
ends, score exactly 0.
"""

from __future__ import annotations

from typing import Any

import pytest

from distcourse import trace
from distcourse.bench import overlap, record
from distcourse.parallel.ddp import DDP


class OneBucketDDP(DDP):
    """Our DDP with every gradient in one bucket whatever the cap: the DDP that
    sends after backward (its one all-reduce starts at the last gradient)."""

    def __init__(self, module: Any, *args: Any, **kwargs: Any) -> None:
        kwargs["bucket_cap_mb"] = 1e6
        super().__init__(module, *args, **kwargs)


@pytest.mark.controls(
    "03_data_parallel",
    r"best bucket size \S+ MB: median hidden share .* at least 0\.5",
    fault="a DDP that puts every gradient in one bucket (it sends after backward), "
    "measured on 2 ranks; a run stored under load",
    printed_on="a stored quiet run (book/measurements/ch03_overlap.json)",
)
def test_a_ddp_that_sends_after_backward_fails() -> None:
    data = overlap.measure(overlap.QUICK, OneBucketDDP)
    assert set(data["buckets"].values()) == {1}
    planted = record.Stored(overlap.NAME, data, {"quiet": True})
    assert overlap.verdict(planted).endswith(": FAIL")
    stored = record.load(overlap.NAME)
    if stored is not None:  # as written: the run stored with the book passes
        assert overlap.verdict(stored).endswith(": PASS")
        busy = record.Stored(overlap.NAME, stored.data, {"quiet": False})
        assert overlap.verdict(busy).endswith(": FAIL")
    after = [  # five buckets, every one launched after the last gradient
        ("forward", 0.0, 1.0),
        ("backward", 1.0, 4.0),
        *((f"all_reduce {i}", 4.0 + i, 4.5 + i) for i in range(5)),
    ]
    queued = [  # launched during backward, served only after it
        ("backward", 1.0, 4.0),
        *((f"all_reduce {i}", 1.5 + 0.5 * i, 4.2 + i) for i in range(5)),
    ]
    assert [trace.hidden_fraction(t) for t in (after, queued)] == [0.0, 0.0]
    served = [("backward", 1.0, 4.0), ("all_reduce 0", 1.5, 3.0)]  # the real thing
    assert trace.hidden_fraction(served) == 1.0
