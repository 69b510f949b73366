"""The labs (distcourse/labs/): each broken program fails in seconds and names the
ranks; each reference fix passes its check; a bad fix is told so in a sentence.

Every run spawns the lab's ranks (2 or 4) for well under a second; the broken runs
are made once, for the whole module. Wrong fixes, each failing with its hint, are
the chapter's negative controls: tests/controls/test_11_debugging.py.
"""

from __future__ import annotations

import threading
import time

import psutil
import pytest
import torch
import torch.distributed as dist
from torch import Tensor

from distcourse.labs import LABS, SKIPPED_COLLECTIVE, Report
from distcourse.labs.solutions import SOLUTIONS

TIMEOUT = 2.0  # seconds a collective may wait in these runs
# what each broken run must say: its kind and a line that shows the cause
EXPECTED = {
    "skipped_collective": ("hang", "rank 0: all_reduce float32[] (4 B)"),
    "collective_order": ("hang", "ranks 0 and 2: all_reduce float32[8, 4] (128 B)"),
    "pipeline_microbatches": ("hang", "rank 0 sent 3 message(s) to rank 1"),
    "uneven_gather": ("hang", "rank 1: all_gather float32[2, 1] (8 B)"),
    "dropout_seed": ("silent", "but rank 1 differs from rank 0"),
    "layernorm_sp": ("silent", "'weight.grad' on ranks 0 and 1 differ"),
    "sampler": ("silent", "16 more than once (sample 0 by ranks 0 and 1)"),
    "unused_parameters": ("silent", "without a gradient in step 1: aux.weight"),
}


@pytest.fixture(scope="module")
def reports() -> dict[str, Report]:
    return {name: lab.run(timeout=TIMEOUT) for name, lab in LABS.items()}


def test_there_are_the_eight_labs_of_the_issue() -> None:
    assert list(LABS) == list(EXPECTED) == list(SOLUTIONS)


@pytest.mark.parametrize("name", list(EXPECTED))
def test_each_broken_lab_fails_within_10_s_naming_the_ranks(
    reports: dict[str, Report], name: str
) -> None:
    report = reports[name]
    kind, line = EXPECTED[name]
    assert report.kind == kind, report.text
    assert line in report.text, report.text
    assert report.ranks, report.text
    assert report.seconds <= 10, report.seconds
    assert "Traceback" not in report.text and "127.0.0.1" not in report.text


def test_a_hang_shows_each_ranks_last_calls(reports: dict[str, Report]) -> None:
    text = reports["skipped_collective"].text
    assert "the ranks part at collective #2:" in text
    assert "rank 0: #1 all_reduce float32[5] (20 B), returned" in text
    assert "#2 all_reduce float32[] (4 B), entered" in text
    ended = reports["pipeline_microbatches"].text
    assert "rank 0: stuck in #6 recv float32[2, 4] from rank 1 (32 B)" in ended
    assert "rank 1: finished its program" in ended
    stage0 = reports["pipeline_microbatches"].columns()[0]
    assert stage0[-1] == "#6 recv float32[2, 4] from rank 1 (32 B), never returned"
    assert reports["skipped_collective"].columns()[1] == [
        "#1 all_reduce float32[5] (20 B), returned",
        "#2 all_reduce float32[5] (20 B), entered",
    ]


@pytest.mark.parametrize("name", list(EXPECTED))
def test_each_reference_fix_passes_its_check(name: str) -> None:
    verdict = LABS[name].check(SOLUTIONS[name], timeout=TIMEOUT)
    assert verdict.passed, str(verdict)
    assert str(verdict).endswith("against one process: PASS")


def _log_not_a_number(loss: Tensor, rank: int, world: int) -> str:
    return "low"


def _log_divides_by_zero(loss: Tensor, rank: int, world: int) -> float:
    return loss.item() / 0


def _log_forever(loss: Tensor, rank: int, world: int) -> float:
    time.sleep(1000)
    return 0.0


@pytest.mark.parametrize(
    "fix, said",
    [
        (42, "check() takes a function `def log_loss(loss, rank, world)"),
        (lambda loss: 0.0, "cannot be called with 3 arguments (loss, rank, world)"),
        (
            _log_not_a_number,
            "log_loss's return value should be a float or int, got str",
        ),
        (_log_divides_by_zero, "_log_divides_by_zero() raised ZeroDivisionError"),
    ],
    ids=["not a function", "wrong arguments", "wrong type", "raises"],
)
def test_a_bad_fix_gets_a_sentence_not_a_traceback(fix: object, said: str) -> None:
    _assert_told(fix, said)


def test_a_fix_that_cannot_travel_to_the_ranks_is_told_so() -> None:
    lock = threading.Lock()

    def log_loss(loss: Tensor, rank: int, world: int) -> float:
        with lock:
            return loss.item()

    _assert_told(log_loss, "your function cannot be sent to the ranks (TypeError")


def _assert_told(fix: object, said: str) -> None:
    verdict = SKIPPED_COLLECTIVE.check(fix, timeout=TIMEOUT)
    text = str(verdict)
    assert not verdict.passed
    assert text.splitlines()[0].endswith(": FAIL")
    assert said in text, text
    assert "Traceback" not in text and "File " not in text


def _log_deadlocks(loss: Tensor, rank: int, world: int) -> float:
    """Rank 0 waits in an all-reduce, rank 1 for a message rank 0 never sends."""
    if rank == 0:
        dist.all_reduce(loss)
    else:
        dist.recv(torch.empty(1), 0)  # devicecheck: host (labs run on gloo)
    return loss.item()


def test_a_deadlock_is_ended_by_the_groups_timeout_and_reported() -> None:
    start = time.monotonic()
    verdict = SKIPPED_COLLECTIVE.check(_log_deadlocks, timeout=1.0)
    assert time.monotonic() - start < 6
    text = str(verdict)
    assert not verdict.passed
    assert "rank 0: all_reduce float32[] (4 B)" in text, text
    assert "rank 1: never entered it" in text, text
    assert "rank 0 sent 0 message(s) to rank 1, which posted 1 receive(s)" in text
    assert "#2 recv float32[1] from rank 0 (4 B), never returned" in text, text


def test_a_fix_that_never_returns_is_stopped_and_leaves_no_process() -> None:
    start = time.monotonic()
    verdict = SKIPPED_COLLECTIVE.check(_log_forever, timeout=TIMEOUT, limit=3.0)
    assert time.monotonic() - start < 8
    assert not verdict.passed
    assert "did not end within its deadline" in str(verdict)
    ranks = [
        p
        for p in psutil.Process().children(recursive=True)
        if "forkserver" not in " ".join(p.cmdline())
        and "resource_tracker" not in " ".join(p.cmdline())
    ]
    assert ranks == []
