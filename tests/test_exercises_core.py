"""The exercise checks' core: one line per check, a bool, never a package traceback.

Numbers and in-process answers run here; answers on ranks run on 2 real gloo ranks:
a right one, a wrong value, an exception in the reader's code, a hang (ended by a
2 s collective timeout), a rank that exits, and no process left behind.
"""

from __future__ import annotations

import os

import psutil
import pytest
import torch
import torch.distributed as dist

from distcourse.exercises import core

HINT = "a hint for the reader"


def _line(capsys: pytest.CaptureFixture) -> str:
    out = capsys.readouterr().out
    assert out.count("\n") == 1, out  # exactly one line
    assert "Traceback" not in out and "distcourse/" not in out, out
    return out.strip()


def test_number_passes_fails_and_names_a_wrong_type(capsys) -> None:
    assert core.check_number("t.n", 12.0, 12, hint=HINT)
    assert _line(capsys) == "t.n: PASS"
    assert not core.check_number("t.n", 13, 12, hint=HINT)
    assert _line(capsys) == f"t.n: FAIL — 13 is too large — hint: {HINT}"
    for bad, words in [("12", "got str"), (True, "got bool"), (float("nan"), "finite")]:
        assert not core.check_number("t.n", bad, 12, hint=HINT)
        assert words in _line(capsys)
    assert core.check_number("t.n", torch.tensor(12.0), 12, hint=HINT)
    assert _line(capsys) == "t.n: PASS"


def test_a_placeholder_gets_the_hint_and_no_verdict(capsys) -> None:
    for check in (
        lambda: core.check_number("t.x", None, 1, hint=HINT),
        lambda: core.check_answer("t.x", None, lambda a: None, hint=HINT),
        lambda: core.check_on_ranks("t.x", None, _sum_probe, 2, hint=HINT),
    ):
        assert check() is False
        assert _line(capsys) == f"t.x: not answered yet — hint: {HINT}"


def _judge(answer: object) -> core.Problem:
    return None if core.call(answer, 3) == 9 else "square(3) should be 9"


def test_answer_judged_in_process_with_the_readers_exception_named(capsys) -> None:
    assert core.check_answer("t.sq", lambda x: x * x, _judge, hint=HINT)
    assert _line(capsys) == "t.sq: PASS"
    assert not core.check_answer("t.sq", lambda x: x + x, _judge, hint=HINT)
    assert "square(3) should be 9" in _line(capsys)
    assert not core.check_answer("t.sq", lambda x: x / 0, _judge, hint=HINT)
    assert "your function raised ZeroDivisionError" in _line(capsys)


def _loops(x: int) -> int:
    while True:
        x += 1


def test_an_answer_that_loops_is_stopped(capsys, monkeypatch) -> None:
    monkeypatch.setattr(core, "IN_PROCESS_LIMIT", 0.2)
    assert not core.check_answer("t.sq", _loops, _judge, hint=HINT)
    assert "your answer ran longer than 0.2 s" in _line(capsys)


def test_per_rank_list_entry_by_entry_names_the_first_wrong_rank(capsys) -> None:
    want = [(2, "S(0)"), (1, "B")]
    check = lambda a: core.check_per_rank(  # noqa: E731
        "t.r", a, want, what="pairs", hint=HINT
    )
    assert check([[2, "s(0)"], (1, "b")])  # a list for a tuple, any case
    assert _line(capsys) == "t.r: PASS"
    assert not check([(2, "S(0)"), (1, "P")])
    assert "the entry for rank 1, (1, 'P'), is not right" in _line(capsys)
    for bad in ([(2, "S(0)")], {0: (2, "S(0)")}, "no"):
        assert not check(bad)
        assert "expected a list of 2 pairs, one per rank" in _line(capsys)
    assert check(None) is False
    assert _line(capsys) == f"t.r: not answered yet — hint: {HINT}"


def test_returns_compares_each_tensor_by_name(capsys) -> None:
    x = torch.arange(4.0)
    want = {"double": x * 2, "square": x * x}
    check = lambda a: core.check_returns(  # noqa: E731
        "t.f", a, (x,), want, hint=HINT
    )
    assert check(lambda t: (t * 2, t * t))
    assert _line(capsys) == "t.f: PASS"
    assert not check(lambda t: (t * 2, t * 3))
    assert "square is off by up to 2" in _line(capsys)  # 3x against x²
    assert not check(lambda t: t * 2)
    assert "expected a pair (double, square), got Tensor" in _line(capsys)
    assert not check(lambda t: t[9])
    assert "your function raised IndexError" in _line(capsys)
    assert check(None) is False
    assert _line(capsys) == f"t.f: not answered yet — hint: {HINT}"


def test_compare_says_type_shape_then_values() -> None:
    want = torch.ones(3)
    assert core.compare(want.clone(), want, "x") is None
    assert "should be a tensor" in core.compare([1, 1, 1], want, "x")
    assert "shape (2,), expected (3,)" in core.compare(torch.ones(2), want, "x")
    assert "off by up to 1" in core.compare(torch.zeros(3), want, "x")
    assert "off by" in core.compare(torch.full((3,), float("nan")), want, "x")
    with pytest.raises(core.AnswerError, match="raised KeyError"):
        core.call(lambda: {}[1])


def _sum_probe(answer: object) -> core.Problem:
    x = torch.tensor([float(dist.get_rank() + 1)])
    got = core.call(answer, x)
    return core.compare(got, torch.tensor([3.0]), "the sum")


def _summed(x: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(x)
    return x


def _hangs_on_rank_1(x: torch.Tensor) -> torch.Tensor:
    if dist.get_rank() == 1:
        dist.recv(x, 0)  # rank 0 never sends
    return x


def _exits(x: torch.Tensor) -> torch.Tensor:
    if dist.get_rank() == 0:
        os._exit(3)
    return x


def test_on_ranks_every_outcome_is_one_line_and_leaves_no_process(capsys) -> None:
    run = lambda answer: core.check_on_ranks(  # noqa: E731
        "t.sum", answer, _sum_probe, 2, hint=HINT, timeout=2.0, limit=20.0
    )
    assert run(_summed)
    assert _line(capsys) == "t.sum: PASS"
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    assert not run(lambda x: x)
    assert "rank 0: the sum is off by up to 2" in _line(capsys)
    assert not run(lambda x: x[5])
    assert "raised IndexError" in _line(capsys)
    assert not run(_hangs_on_rank_1)
    line = _line(capsys)  # rank 0 may be gone (finished) or waiting in its barrier
    assert "rank 1: your function waited" in line and "no matching send" in line
    assert not run(_exits)
    assert "rank 0 failed: process died (exit code 3)" in _line(capsys)
    assert not run("not a function")
    assert "expected a function, got str" in _line(capsys)
    after = {p.pid for p in psutil.Process().children(recursive=True)}
    assert after <= before, "a rank outlived its check"
