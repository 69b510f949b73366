"""Chapter 12b's exercises: every solution passes, and a wrong answer of each kind
fails with its hint (the ring step on 4 real gloo ranks)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from distcourse.exercises import ch12_context as ex
from distcourse.exercises.solutions import ch12_context as solutions


def _added(out_a, lse_a, out_b, lse_b):  # noqa: ANN001, ANN202
    """The merge that forgets to rescale: the two outputs averaged."""
    return (out_a + out_b) / 2, torch.logaddexp(lse_a, lse_b)


def _from_zero(seq: int, cp: int, rank: int) -> torch.Tensor:
    """The positions pitfall: every rank counts its tokens from 0."""
    return torch.arange(seq // cp)


def _all_gathered(x: torch.Tensor) -> torch.Tensor:
    """A ring step by all_gather: right values, the wrong messages."""
    rows = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(rows, x)
    return rows[(dist.get_rank() - 1) % dist.get_world_size()]


def test_every_exercise_has_a_check_and_a_solution() -> None:
    for name in ex.EXERCISES:
        assert callable(getattr(ex, f"check_{name}"))
        assert hasattr(solutions, name)


@pytest.mark.parametrize("name", ex.EXERCISES)
def test_the_solution_passes(name: str, capsys: pytest.CaptureFixture) -> None:
    assert getattr(ex, f"check_{name}")(getattr(solutions, name)) is True
    assert capsys.readouterr().out == f"ch12b.{name}: PASS\n"


@pytest.mark.parametrize(
    ("name", "wrong", "says"),
    [
        ("merge", _added, "out is off by"),
        ("positions", _from_zero, "positions(8, 2, 0)"),
        ("ring_pass", _all_gathered, "it calls all_gather"),
        ("ring_bytes", 7 * 2 * 2**20, "too small"),
        ("contiguous_imbalance", 1.0, "too small"),
    ],
)
def test_a_wrong_answer_fails_with_its_hint(
    name: str, wrong: object, says: str, capsys: pytest.CaptureFixture
) -> None:
    assert getattr(ex, f"check_{name}")(wrong) is False
    out = capsys.readouterr().out
    assert out.startswith(f"ch12b.{name}: FAIL") and says in out and "hint:" in out


def test_a_placeholder_is_not_answered_yet(capsys: pytest.CaptureFixture) -> None:
    assert ex.check_merge(None) is False
    assert "not answered yet" in capsys.readouterr().out
