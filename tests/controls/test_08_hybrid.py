"""Negative controls of chapter 8: its own cells (three layouts against one process,
their bytes against the formula), run with a fault planted in the hybrid runner,
must turn each verdict they print from PASS to FAIL.

The faults are in `HybridGPT`'s own steps: gradients summed over the dp replicas
instead of averaged (a x2 on 2 replicas: the bug the check was blind to under AdamW,
shown below), no dp all-reduce at all, a gathered state that leaves a parameter out.
The chapter's kernel cells start their own ranks with `spawn`; the harness plants
the fault in those too. Its 8 ranks run the %%ranks cell (tests/controls/harness.py).
"""

from __future__ import annotations

from collections.abc import Callable

import harness
from harness import Fault, Plant
from torch import Tensor

from distcourse.parallel import hybrid

CHAPTER = harness.Chapter(
    "08_hybrid",
    setup=["mesh = hybrid.make_mesh(hybrid.Layout(dp=2, pp=2, tp=2), CFG)"],
    here="from distcourse import viz\nfrom distcourse.parallel import hybrid",
    stored=True,  # its cells take long: as written is what the notebook stored
)
CELLS = [  # the cells, by a text of each: the three layouts, then their bytes
    "def lines(found: dict)",
    "DP_TP = hybrid.Layout(dp=2, tp=2)",
    "dp_pp = spawn(",
    "found = hybrid.against_one_process(hybrid.Layout(2, 2, 2)",
    'everywhere = [ranks.pull("found", r)',
]


def summed_over_dp(average: Callable) -> Callable:
    """Gradients summed over the dp group, not averaged: every gradient x dp."""

    def faulty(self: hybrid.HybridGPT) -> None:
        average(self)
        for p in self.module.parameters():
            p.grad.mul_(self.layout.dp)

    return faulty


def never_averaged(self: hybrid.HybridGPT) -> None:
    """No dp all-reduce: each replica trains on its own share only."""


def drops_a_key(state_of: Callable) -> Callable:
    """A gathered state that leaves ln_f.weight out on every rank."""

    def faulty(self: hybrid.HybridGPT) -> dict[str, Tensor]:
        state = state_of(self)
        return {k: v for k, v in state.items() if not k.endswith("ln_f.weight")}

    return faulty


RUNNER = hybrid.HybridGPT
FIRST = CELLS[:2]  # 2 x 1 x 2 alone, with SGD and AdamW
FAULTS = {
    "summed": Fault(FIRST, Plant(RUNNER, "average_gradients", summed_over_dp, True)),
    "never averaged": Fault(CELLS, Plant(RUNNER, "average_gradients", never_averaged)),
    "drops a key": Fault(FIRST, Plant(RUNNER, "one_process_state", drops_a_key, True)),
}


CONTROLS = harness.Controls(
    "08_hybrid",
    test_a_doubled_gradient_fails_under_sgd=harness.Flip(
        ["summed"],
        r"gradients of step 1 vs one process",
        "gradients summed over the dp replicas, not averaged (x2)",
        r"losses of \d+ sgd steps vs one process",
        "gradients summed over the dp replicas, not averaged (x2)",
        r"parameters after \d+ sgd steps vs one process",
        "gradients summed over the dp replicas, not averaged (x2)",
    ),
    test_replicas_that_never_average_fail=harness.Flip(
        ["never averaged"],
        r"losses of \d+ adamw steps vs one process",
        "no dp all-reduce: each replica trains on its own share",
        r"parameters after \d+ adamw steps vs one process",
        "no dp all-reduce: each replica trains on its own share",
        r"ledger == formula",
        "no dp all-reduce: the dp axis sends nothing",
    ),
    test_a_parameter_no_rank_holds_is_seen=harness.Flip(
        ["drops a key"],
        r"every parameter on some rank",
        "the gathered state leaves ln_f.weight out on every rank",
    ),
)
globals().update(CONTROLS.tests())


def test_adamw_cannot_see_a_doubled_gradient(ran: harness.Ran) -> None:
    """Why the check moved to gradients and SGD: with every gradient doubled,
    AdamW's losses still equal one process's (its step m / (sqrt(v) + eps) loses
    the factor)."""
    harness.assert_holds(ran, "summed", r"losses of \d+ adamw steps vs one process")
