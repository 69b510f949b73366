"""Negative controls of chapter 8b: its own cells (a 2 x 2 MLP on global tensors,
against one process, ParallelMLP and DTensor; two such stages as a pipeline), run
with a fault planted in the global-tensor package, must turn each verdict they print
from PASS to FAIL.

The faults: `layouts.dp_tp_plan` with its column and row layers swapped; boxing that
sums a partial tensor twice (the row all_reduce doubled: every loss and gradient
after it x 2); boxing that gathers a split tensor twice (the step's bytes miss the
formula, its numbers do not). One spawn of the chapter's 8 ranks runs them all
(tests/controls/harness.py).
"""

from __future__ import annotations

from collections.abc import Callable

import harness
from boxing_faults import gathered_twice, sums_twice
from harness import Fault, Plant

from distcourse.global_tensor import boxing, layouts

CHAPTER = harness.Chapter(
    "08b_hybrid_global", setup=["mine = p if rank < 4 else q"], stored=True
)
PLAN = "model = gt.parallelize(copy.deepcopy(one), mine, plan)"  # cells, by a text
ONE_STAGE = [PLAN, "xg, yg = layouts.cut(x", "mp = ParallelMLP.from_module"]
DTENSOR = ["mesh = init_device_mesh(device.type, (2, 2, 2)", "loss: ours vs DTensor"]
PIPELINE = ["stages = gt.Stages(", "losses.append(stages.step(", "every gradient of 3"]
BYTES = "last step's bytes, every rank: ledger == formula"


def swapped(plan: Callable) -> Callable:
    """dp_tp_plan with its column and row layers swapped."""
    return lambda model, column, row, **kwargs: plan(
        model, column=row, row=column, **kwargs
    )


FAULTS = {
    "swapped plan": Fault([PLAN], Plant(layouts, "dp_tp_plan", swapped, wrap=True)),
    "sums twice": Fault(
        [*ONE_STAGE, *DTENSOR, *PIPELINE, BYTES],
        Plant(boxing, "convert", sums_twice, wrap=True),
    ),
    "gathered twice": Fault(
        [PIPELINE[0], PIPELINE[1], BYTES],
        Plant(boxing, "convert", gathered_twice, wrap=True),
    ),
}


CONTROLS = harness.Controls(
    "08b_hybrid_global",
    test_a_swapped_plan_is_not_the_plan=harness.Flip(
        ["swapped plan"],
        r"plan == dp_tp_plan\(one, column=\['fc'\], row=\['proj'\]\)",
        "dp_tp_plan with its column and row layers swapped",
    ),
    test_a_partial_summed_twice_fails_every_comparison=harness.Flip(
        ["sums twice"],
        r"loss [\d.]+, one process [\d.]+:",
        "boxing sums a partial tensor twice: the row all_reduce doubled",
        r"grad \(.*\)\s+vs one process",
        "boxing sums a partial tensor twice: every gradient x 2",
        r"loss vs ParallelMLP's",
        "boxing sums a partial tensor twice: the row all_reduce doubled",
        r"my piece .* vs ParallelMLP's",
        "boxing sums a partial tensor twice: every gradient x 2",
        r"loss: ours vs DTensor",
        "boxing sums a partial tensor twice: the row all_reduce doubled",
        r"ours \(.*\)\s+DTensor \(",
        "boxing sums a partial tensor twice: every gradient x 2",
        r"every gradient of 3 steps, both stages, vs one process",
        "boxing sums a partial tensor twice: every gradient x 2",
        r"losses \[.*\], one process \[",
        "boxing sums a partial tensor twice: the row all_reduce doubled",
        r"parameters after 3 steps, both stages, vs one process",
        "boxing sums a partial tensor twice: every gradient x 2",
    ),
    test_a_gather_done_twice_breaks_the_byte_line=harness.Flip(
        ["gathered twice"],
        r"ledger == formula",
        "boxing that gathers a split tensor twice (more bytes, the same numbers)",
    ),
)
globals().update(CONTROLS.tests())
