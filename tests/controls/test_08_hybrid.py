"""Negative controls for chapter 8's verdicts: `hybrid.against_one_process`, the
check the chapter runs, on runners with a planted fault, prints FAIL / False.

The faults are HybridGPT subclasses that change one step (`average_gradients`,
`one_process_state`). The first is the bug the check was blind to under AdamW:
gradients summed over the dp replicas instead of averaged, a x2 on 2 replicas.
One spawn of 4 ranks (dp 2 x tp 2) runs every fault.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from distcourse.examples.gpt import GPTConfig
from distcourse.launch import spawn
from distcourse.parallel import hybrid

CFG = GPTConfig()  # the chapter's model
LAYOUT = hybrid.Layout(dp=2, tp=2)


class SummedOverDp(hybrid.HybridGPT):
    """Gradients summed over the dp group, not averaged: every gradient x dp."""

    def average_gradients(self) -> None:
        super().average_gradients()
        for p in self.module.parameters():
            p.grad.mul_(self.layout.dp)


class NeverAveraged(hybrid.HybridGPT):
    """No dp all-reduce: each replica trains on its own share only."""

    def average_gradients(self) -> None:
        pass


class DropsAKey(hybrid.HybridGPT):
    """A parameter the gathered state leaves out on every rank."""

    def one_process_state(self) -> dict[str, Tensor]:
        state = super().one_process_state()
        return {k: v for k, v in state.items() if not k.endswith("ln_f.weight")}


def _faults() -> dict[str, list[str]]:
    """Each fault's lines, as the chapter prints them, on this rank."""
    torch.set_num_threads(1)
    runs = {
        "summed, sgd": (SummedOverDp, "sgd"),
        "summed, adamw": (SummedOverDp, "adamw"),
        "never averaged, adamw": (NeverAveraged, "adamw"),
        "drops a key": (DropsAKey, "sgd"),
    }
    found = {}
    for name, (runner, opt) in runs.items():
        got = hybrid.against_one_process(LAYOUT, CFG, optimizer=opt, runner=runner)
        found[name] = [*hybrid.verdicts(got), hybrid.bytes_line(got)]
    return found


@pytest.fixture(scope="module")
def lines() -> dict[str, list[str]]:
    """Rank 0's lines for every fault (one spawn for the whole file)."""
    return spawn(_faults, 4, timeout=120)[0]


def _line(lines: list[str], start: str) -> str:
    (hit,) = [ln for ln in lines if ln.startswith(start)]
    return hit


@pytest.mark.controls(
    "08_hybrid",
    r"gradients of step 1 vs one process",
    fault="gradients summed over the dp replicas, not averaged (x2)",
)
@pytest.mark.controls(
    "08_hybrid",
    r"losses of \d+ sgd steps vs one process",
    fault="gradients summed over the dp replicas, not averaged (x2)",
)
@pytest.mark.controls(
    "08_hybrid",
    r"parameters after \d+ sgd steps vs one process",
    fault="gradients summed over the dp replicas, not averaged (x2)",
)
def test_a_doubled_gradient_fails_under_sgd(lines: dict) -> None:
    got = lines["summed, sgd"]
    for start in ("gradients of step 1", "losses of", "parameters after"):
        assert _line(got, start).endswith("FAIL"), got


def test_adamw_losses_cannot_see_a_doubled_gradient(lines: dict) -> None:
    """Why the check moved to gradients and SGD: with every gradient doubled,
    AdamW's losses still equal one process's (its step m / (sqrt(v) + eps) loses
    the factor); its parameters drift only through eps, where gradients are tiny
    (1.2e-3 after 6 steps, measured). The gradient line fails outright."""
    got = lines["summed, adamw"]
    assert _line(got, "gradients of step 1").endswith("FAIL"), got
    assert _line(got, "losses of").endswith("PASS"), got


@pytest.mark.controls(
    "08_hybrid",
    r"losses of \d+ adamw steps vs one process",
    fault="no dp all-reduce: each replica trains on its own share",
)
@pytest.mark.controls(
    "08_hybrid",
    r"parameters after \d+ adamw steps vs one process",
    fault="no dp all-reduce: each replica trains on its own share",
)
@pytest.mark.controls(
    "08_hybrid",
    r"ledger == formula",
    fault="no dp all-reduce: the dp axis sends nothing",
)
def test_replicas_that_never_average_fail(lines: dict) -> None:
    got = lines["never averaged, adamw"]
    for start in ("gradients of step 1", "losses of", "parameters after"):
        assert _line(got, start).endswith("FAIL"), got
    assert _line(got, "dp ").endswith("ledger == formula: False"), got


@pytest.mark.controls(
    "08_hybrid",
    r"every parameter on some rank",
    fault="the gathered state leaves ln_f.weight out on every rank",
)
def test_a_parameter_no_rank_holds_is_seen(lines: dict) -> None:
    got = lines["drops a key"]
    assert _line(got, "every parameter").endswith("False"), got
