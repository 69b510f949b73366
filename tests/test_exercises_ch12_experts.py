"""Chapter 12's expert exercises: every solution passes; a wrong answer fails with
its hint; the rank exercise on 4 real gloo ranks."""

from __future__ import annotations

import pytest
import torch

from distcourse.exercises import ch12_experts as ex
from distcourse.exercises.solutions import ch12_experts as solutions


def _last_line(capsys: pytest.CaptureFixture[str]) -> str:
    return capsys.readouterr().out.strip().splitlines()[-1]


def test_every_exercise_has_a_check_and_a_solution() -> None:
    for name in ex.EXERCISES:
        assert callable(getattr(ex, f"check_{name}")) and hasattr(solutions, name)


@pytest.mark.parametrize("name", ["capacity", "route_top1", "dispatch_bytes"])
def test_in_process_solutions_pass(name: str, capsys) -> None:
    assert getattr(ex, f"check_{name}")(getattr(solutions, name))
    assert _last_line(capsys) == f"ch12.{name}: PASS"


def _first_come_ignored(logits: torch.Tensor, room: int) -> tuple:
    expert = logits.argmax(dim=-1)
    return expert, torch.ones_like(expert, dtype=torch.bool)  # never drops


@pytest.mark.parametrize(
    "name, wrong",
    [
        ("capacity", 128),  # forgot the capacity factor
        ("route_top1", _first_come_ignored),
        ("dispatch_bytes", 3 * 100 * 1024 * 4 // 4),  # the ring's even share
    ],
)
def test_wrong_answers_fail_with_the_hint(name: str, wrong: object, capsys) -> None:
    assert not getattr(ex, f"check_{name}")(wrong)
    line = _last_line(capsys)
    assert line.startswith(f"ch12.{name}: FAIL") and "hint:" in line


def _no_exchange(per_expert: torch.Tensor) -> torch.Tensor:
    return per_expert.view(4, 2)  # its own counts, never sent


def test_exchange_counts_on_four_ranks(capsys) -> None:
    assert ex.check_exchange_counts(solutions.exchange_counts)
    assert _last_line(capsys) == "ch12.exchange_counts: PASS"
    assert not ex.check_exchange_counts(_no_exchange)
    assert "the counts" in _last_line(capsys)
