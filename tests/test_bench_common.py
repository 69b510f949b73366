"""distcourse.bench.common: the command-line pieces every benchmark shares."""

from __future__ import annotations

import argparse
import json
import time

import pytest

from distcourse.bench import common
from distcourse.bench.__main__ import available
from distcourse.launch import spawn

ROWS = [
    dict(ranks=2, implementation="torch", step_ms=2.0, vs_torch=1.0),
    dict(ranks=2, implementation="ours", step_ms=1.5, vs_torch=0.75),
]


def test_parser_takes_json_and_quick() -> None:
    args = common.parser("x", "a benchmark", "tiny").parse_args(["--json", "--quick"])
    assert args.json and args.quick


def test_ratio_of_finds_the_row_and_names_a_missing_one() -> None:
    assert common.ratio_of(ROWS, "ours", 2) == 0.75
    with pytest.raises(KeyError, match="'ours' on 4 ranks"):
        common.ratio_of(ROWS, "ours", 4)


def test_table_aligns_a_header_and_a_line_per_row() -> None:
    lines = common.table(ROWS, 15, "vs torch DDP").splitlines()
    assert len(lines) == 3 and lines[0].endswith("vs torch DDP")
    assert lines[2].split() == ["2", "ours", "1.50", "0.75"]
    assert len({len(line) for line in lines}) == 1


def test_report_prints_json_or_text(capsys: pytest.CaptureFixture) -> None:
    assert common.report({"ratio": 0.5}, True, lambda: ["unused"]) == 0
    assert json.loads(capsys.readouterr().out) == {"ratio": 0.5}
    common.report({}, False, lambda: ["a", "b"])
    assert capsys.readouterr().out == "a\nb\n"


def test_a_comparison_reports_its_ratios_on_the_last_world_size(
    capsys: pytest.CaptureFixture,
) -> None:
    bench = common.Comparison("x", ("torch", "ours"), ("ratio",), 15, "vs torch")
    cfg = common.MLPConfig(1, 1, 1, 1, 0, 1, worlds=(2,))
    text = ("the model", "ours / torch on {ranks} ranks: {ratio:.2f}")
    assert bench.report(argparse.Namespace(json=True), cfg, ROWS, text, ranks=2) == 0
    result = json.loads(capsys.readouterr().out)
    assert list(result) == ["benchmark", "ratio", "ranks", "config", "table"]
    assert (result["benchmark"], result["ratio"], result["table"]) == ("x", 0.75, ROWS)
    assert result["config"]["worlds"] == [2]
    bench.report(argparse.Namespace(json=False), cfg, ROWS, text)
    assert capsys.readouterr().out.splitlines() == [
        "the model",
        *bench.table(ROWS).splitlines(),
        "ours / torch on 2 ranks: 0.75",
    ]
    assert bench.table(ROWS) == common.table(ROWS, 15, "vs torch")
    assert bench.parser("a benchmark", "tiny").prog == "python -m distcourse.bench x"


def test_common_is_not_listed_as_a_benchmark() -> None:
    assert {"common", "__main__"}.isdisjoint(available()) and "ddp" in available()


SLOW = 0.1  # seconds: a no-op's round (a collective) took 3 ms on a busy CI box


def _two_steps() -> list[list[float]]:
    fast, slow = (lambda: None), (lambda: time.sleep(SLOW))
    return common.time_rounds([fast, slow], warmup=1, count=4)


def test_time_rounds_times_each_step_on_real_ranks_and_rows_give_ratios() -> None:
    times = spawn(_two_steps, 2)
    assert times[0] == times[1]  # every rank holds the slowest rank's times
    assert [len(t) for t in times[0]] == [4, 4]
    assert min(times[0][1]) >= SLOW > max(times[0][0])  # a margin loaded CI keeps
    table = common.rows(2, ["fast", "slow"], times[0], reference=0)
    assert [r["implementation"] for r in table] == ["fast", "slow"]
    assert table[0]["vs_torch"] == 1.0 and table[1]["vs_torch"] > 1.0
