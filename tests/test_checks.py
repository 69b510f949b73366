"""The verdicts the chapters print: stable text, and comparisons across real ranks."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from distcourse import checks, runtime
from distcourse.examples import models
from distcourse.launch import spawn
from distcourse.parallel import replicas


def test_a_pass_hides_the_noise_and_a_fail_shows_the_value() -> None:
    assert checks.verdict(0.0, 1e-6) == "<= 1e-06: PASS"
    assert checks.verdict(8.9e-8, 1e-6) == checks.verdict(2.4e-7, 1e-6)
    assert checks.verdict(3.2e-4, 1e-6) == "= 3.2e-04 > 1e-06: FAIL"
    with pytest.raises(ValueError, match="tolerance must be positive"):
        checks.verdict(0.0, 0)


def _rank_values() -> tuple[float, float | None, bool, bool]:
    rank = runtime.require_initialized().rank
    worst = checks.max_over_ranks(0.5 * rank)
    pair = dist.new_group([0, 1])  # every rank makes it; ranks 0 and 1 use it
    in_pair = checks.max_over_ranks(0.5 * rank, pair) if rank < 2 else None
    torch.manual_seed(0)
    model = models.toy_mlp()
    same = replicas.same_on_all_ranks(model)
    with torch.no_grad():
        model[0].bias[0] += rank  # rank 0 keeps its weights; the others move theirs
    return worst, in_pair, same, replicas.same_on_all_ranks(model)


def test_max_over_ranks_and_same_on_all_ranks_on_three_ranks() -> None:
    """The largest value over the world, and over a group (rank 2's 1.0 left out)."""
    results = spawn(_rank_values, 3, timeout=10)
    assert results == [(1.0, 0.5, True, False)] * 2 + [(1.0, None, True, False)]


def test_outcomes_says_how_each_case_ended_and_lets_other_errors_through() -> None:
    def bad() -> None:
        raise ValueError("world_size=3 is not divisible by 2")

    got = checks.outcomes({"fine": lambda: None, "bad": bad})
    assert got == ["fine: no error", "bad: world_size=3 is not divisible by 2"]
    typed = checks.outcomes({"bad": bad}, with_type=True)
    assert typed == ["bad: ValueError: world_size=3 is not divisible by 2"]
    with pytest.raises(KeyError):
        checks.outcomes({"other": lambda: {}["x"]})
