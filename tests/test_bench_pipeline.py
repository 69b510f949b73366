"""The pipeline benchmark runs end to end (quick mode) and reports what it promises;
its timings are not checked here, only that they are there and consistent."""

from __future__ import annotations

import json

import pytest

from distcourse.bench import pipeline


def test_quick_json_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert pipeline.main(["--quick", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)  # one JSON object, nothing else
    assert report["benchmark"] == "pipeline"
    cfg = pipeline.QUICK
    assert [row["m"] for row in report["table"]] == [1, *cfg.sweep]
    assert report["m"] in cfg.sweep
    best = next(r for r in report["table"] if r["m"] == report["m"])
    assert (
        report["speedup"]
        == best["speedup"]
        == max(r["speedup"] for r in report["table"][1:])
    )
    m = report["m"]
    assert report["of_limit"] == pytest.approx(
        report["speedup"] / (2 * m / (m + 1)), abs=2e-3
    )
    # efficiency: an ideal pipeline of the same stages over the measured step
    assert (report["efficiency"], report["ideal_ms"]) == (
        best["efficiency"],
        best["ideal_ms"],
    )
    assert all(0 < r["efficiency"] and 0 < r["ideal_ms"] for r in report["table"])
    assert report["per_micro_batch_ms"] != 0
    assert report["bubble_formula"] == round(3 / (cfg.m4 + 3), 4)
    assert 0 < report["bubble_measured"] < 1
    assert report["bubble_error"] == pytest.approx(
        report["bubble_measured"] / report["bubble_formula"] - 1, abs=2e-3
    )
    assert report["ratio"] > 0 and report["ours_ms"] > 0 and report["torch_ms"] > 0
    low, high = report["ratio_quartiles"]  # the rounds' spread around the median
    assert report["zb_ratio"] > 0 and report["torch_zb_ms"] > 0
    assert report["plain_ratio"] > 0 and report["plain_ms"] > 0  # the plain runner
    assert low <= report["ratio"] <= high
    assert len(report["load"]) == 3
    rows = report["schedules"]  # our three schedules, timed in the same rounds
    assert set(rows) == {"1F1B", "GPipe", "ZB-H1"}
    assert rows["1F1B"]["bubble"] == report["bubble_measured"]
    assert rows["GPipe"]["formula"] == report["bubble_formula"]
    assert rows["ZB-H1"]["formula"] == round(3 / (3 * cfg.m4 + 3), 4)
    assert all(row["step_ms"] > 0 and 0 < row["bubble"] < 1 for row in rows.values())


def test_sleeping_blocks_take_their_time_forward_and_backward() -> None:
    import time

    import torch

    block = pipeline.Block(4, sleep_per_sample=0.005)
    x = torch.ones(2, 4, requires_grad=True)
    start = time.perf_counter()
    y = block(x)
    mid = time.perf_counter()
    y.sum().backward()
    end = time.perf_counter()
    assert mid - start >= 0.01 and end - mid >= 0.02  # 2 samples x 5 ms, then x 2
    assert torch.equal(x.grad, torch.ones(2, 4))  # the scale starts at one


def test_two_ranks_only(capsys: pytest.CaptureFixture[str]) -> None:
    assert pipeline.main(["--quick", "--json", "--two"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["m"] in pipeline.QUICK.sweep and report["efficiency"] > 0
    assert "ratio" not in report and "schedules" not in report  # no 4-rank part
