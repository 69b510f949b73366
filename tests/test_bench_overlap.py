"""Chapter 3's overlap benchmark: the median share at the best cap, judged against
0.5 on a stored run; the report prints the stored medians beside the live ones."""

from __future__ import annotations

import pytest

from distcourse.bench import overlap, record


def _run(shares: dict[str, list[float]]) -> dict:
    return {"buckets": {cap: 5 for cap in shares}, "shares": shares}


def test_the_verdict_takes_the_median_at_the_best_cap() -> None:
    """At 0.25 MB the median is 0.6 (one step at 0.9 does not count for more); at
    0.01 MB a single lucky step reaches 1.0 but the median is 0.1."""
    data = _run({"0.01": [0.0, 0.1, 1.0], "0.25": [0.5, 0.6, 0.9], "4": [0.0] * 3})
    assert overlap.best(data) == ("0.25", 0.6)
    quiet = record.Stored(overlap.NAME, data, {"quiet": True})
    assert overlap.verdict(quiet) == (
        "best bucket size 0.25 MB: median hidden share 0.60 of 3 rank-steps, "
        "at least 0.5: PASS"
    )
    busy = record.Stored(overlap.NAME, data, {"quiet": False})
    assert overlap.verdict(busy).endswith(": FAIL")
    outliers = _run({"0.01": [0.0, 0.0, 1.0], "4": [0.0] * 3})  # at least one
    low = record.Stored(overlap.NAME, outliers, {"quiet": True})
    assert overlap.verdict(low).endswith(
        "median hidden share 0.00 of 3 rank-steps, at least 0.5: FAIL"
    )


def test_the_report_prints_stored_and_live_or_says_none_is_stored(
    capsys: pytest.CaptureFixture[str],
) -> None:
    stored = record.Stored(
        overlap.NAME,
        _run({"0.25": [0.7, 0.8], "4": [0.0, 0.0]}),
        {"quiet": True, "cores": 2, "ranks": 2, "threads_per_rank": 1},
    )
    live = _run({"0.25": [0.1, 0.2], "4": [0.0, 0.0]})
    overlap.report(stored, live)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == " 0.25 MB, 5 bucket(s): stored 0.75  (live) 0.15"
    assert lines[2].startswith("stored run: 2 cores") and lines[-1].endswith("PASS")
    overlap.report(None, live)
    missing = capsys.readouterr().out.splitlines()
    assert missing[0].startswith("no stored run 'ch03_overlap' yet")
    assert missing[1] == " 0.25 MB: (live) 0.15"


def test_a_quick_run_measures_every_cap_on_every_rank() -> None:
    data = overlap.measure(overlap.QUICK)
    assert list(data["shares"]) == ["0.25", "4"] and data["buckets"]["4"] == 1
    steps = overlap.QUICK.steps * overlap.QUICK.ranks
    assert all(len(s) == steps and 0 <= min(s) for s in data["shares"].values())
    assert max(data["shares"]["4"]) == 0.0  # one bucket, sent at the last gradient
