"""Chapter 5's step 0 as a stored run: the best pipelined split's speed-up over the
naive one, judged against 1.2 on medians; each split's cut balance shown."""

from __future__ import annotations

import pytest

from distcourse.bench import record, resnet


def _data(seconds: list[float]) -> dict:
    """Rows as the script writes them: split, m, median seconds, stage ms, cut."""
    splits = [(32, 1), (4, 8), (8, 4), (16, 2)]
    return {
        "one": 1.0,
        "batches": 3,
        "rows": [
            [s, m, t, [100.0, 80.0], 2]
            for (s, m), t in zip(splits, seconds, strict=True)
        ],
    }


def test_the_best_split_is_judged_against_the_speedup() -> None:
    data = _data([1.2, 1.1, 0.9, 1.0])
    assert resnet.best(data) == (8, 4, pytest.approx(1.2 / 0.9))
    assert resnet.verdict(record.Stored(resnet.NAME, data, {"quiet": True})) == (
        "best pipelined split 8 (4 micro-batches): 1.33x the naive split and 2.40x "
        "its stages taking turns, both at least 1.2x: PASS"
    )
    assert resnet.verdict(record.Stored(resnet.NAME, data, {"quiet": False})).endswith(
        "FAIL"
    )
    slow = _data([1.2, 1.3, 1.1, 1.05])  # 1.14x at best
    assert resnet.verdict(record.Stored(resnet.NAME, slow, {"quiet": True})).endswith(
        "FAIL"
    )


def test_micro_batches_cheaper_per_image_without_overlap_fail() -> None:
    """Split 8 beats naive 1.5x, but takes as long as its 4 micro-batches' compute
    added up (3 batches x 4 x 180 ms = 2.16 s): no overlap, so FAIL."""
    data = _data([3.24, 3.0, 2.16, 3.0])
    assert resnet.in_turns(data, data["rows"][2]) == pytest.approx(2.16)
    line = resnet.verdict(record.Stored(resnet.NAME, data, {"quiet": True}))
    assert "1.50x the naive split and 1.00x its stages taking turns" in line
    assert line.endswith("FAIL")


def test_the_table_shows_each_cut_its_balance_and_the_live_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    stored = record.Stored(resnet.NAME, _data([1.2, 1.1, 0.9, 1.0]), {"quiet": True})
    resnet.report(stored, _data([1.0, 1.0, 1.0, 2.0]))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["split", "m", "cut"]
    assert lines[1].split() == ["32", "1", "2", "100.0", "80.0", "1.25", "1.00x"]
    assert lines[3].endswith("1.33x  (live) 1.00x")
    assert lines[-1].endswith("PASS")
    resnet.report(None, _data([1.0, 1.0, 1.0, 2.0]))
    missing = capsys.readouterr().out.splitlines()
    assert missing[0].startswith("no stored run 'ch05_split' yet")
    assert missing[-1] == "split 16 ( 2 micro-batches): (live) 0.50x"
