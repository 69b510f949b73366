"""Negative controls of chapter 5: its own cells (four schedules timed and metered on
sleeping stages; our runners, the plain one and torch's schedules against one
process), run with a fault planted, must turn each verdict they print from PASS to
FAIL.

The faults: the activation meter that never releases a micro-batch's activations
(1F1B then holds all m at once, against in_flight's prediction), and each runner
handed a loss m times the mean (micro-batch losses summed, not averaged: every
gradient m times too large). One spawn of the chapter's 4 ranks runs them
(tests/controls/harness.py); the lines as written are the stored notebook's.

Step 0's verdict is judged on a run stored in book/measurements/ch05_split.json
(`bench.resnet.verdict`, on the medians of the script's timed runs): its control
runs the same script with a pipeline whose stages take turns (each rank runs a
micro-batch's forward and then its backward before the next forward, so the two
ranks never compute at once): its time is its micro-batches' compute added up, so
its speed-up over the stages taking turns stays near 1 on any machine, loaded or not
(over the naive split alone it passed on a loaded one: micro-batches of 8 cost less
per image there).
"""

from __future__ import annotations

from collections.abc import Callable

import harness
import pytest
from harness import Fault, Plant, Swap

from distcourse.bench import resnet
from distcourse.parallel import pipeline as pp

CHAPTER = harness.Chapter(
    "05_pipeline", setup=['pair = Mesh((2, 2), ("dp", "pp")).group("pp")'], stored=True
)
METERED = [
    "def measure(sched",
    "on_two = {name: measure(s, pair)",
    "in_flight predicts",
]
RUNNERS = [
    "alone = copy.deepcopy(model)",
    "plain = PlainPipeline(",
    "pipe = pp.Pipeline(stages, sched, F.mse_loss)",
    "theirs = TorchPipeline(stages, name, M, F.mse_loss)",
]
SUMMED = "lambda o, t: F.mse_loss(o, t) * M"  # a loss m times the mean


def never_released(self: pp.ActivationMeter, key: object) -> None:
    """The runner never frees a micro-batch's activations."""


FAULTS = {
    "never freed": Fault(METERED, Plant(pp.ActivationMeter, "release", never_released)),
    "summed": Fault(
        RUNNERS,
        Swap("                          sched, F.mse_loss)", f"sched, {SUMMED})"),
        Swap(
            "    pipe = pp.Pipeline(stages, sched, F.mse_loss)",
            f"    pipe = pp.Pipeline(stages, sched, {SUMMED})",
        ),
        Swap(
            "    theirs = TorchPipeline(stages, name, M, F.mse_loss)",
            f"    theirs = TorchPipeline(stages, name, M, {SUMMED})",
        ),
    ),
}


CONTROLS = harness.Controls(
    "05_pipeline",
    test_activations_never_freed_break_the_in_flight_prediction=harness.Flip(
        ["never freed"],
        r"GPipe and 1F1B held what in_flight predicts on every rank",
        "the runner never frees a micro-batch's activations",
    ),
    test_summed_micro_batch_losses_fail_every_equivalence=harness.Flip(
        ["summed"],
        r"\] (GPipe|1F1B|interleaved 1F1B \(v=2\)|ZB-H1)\s+loss [\d.]+; loss and all",
        "micro-batch losses summed, not averaged (gradients m times too large)",
        r"plain (GPipe|1F1B|interleaved 1F1B \(v=2\))\s+loss and all gradients",
        "micro-batch losses summed, not averaged (gradients m times too large)",
        r"torch [\w ]+?\s+loss and all gradients",
        "micro-batch losses summed, not averaged (gradients m times too large)",
    ),
)
globals().update(CONTROLS.tests())


PIPELINE = (
    "    pipe = pp.Pipeline(stages, pp.gpipe(2, batch // split), F.mse_loss, "
    "timeout=300)"
)
TAKING_TURNS = (  # rank r: F r.0, B r.0, F r.1, B r.1, ...: a valid, serial schedule
    "    pipe = pp.Pipeline(stages, pp.Schedule('turns', 2, batch // split, 1, "
    "tuple(tuple(pp.Action(k, r, j) for j in range(batch // split) for k in 'FB') "
    "for r in (0, 1))), F.mse_loss, timeout=300)"
)


@pytest.mark.controls(
    "05_pipeline",
    r"best pipelined split \d+ \(\d+ micro-batches\): .* at least 1\.2x",
    fault="a pipeline whose stages take turns (each forward after the previous "
    "micro-batch's backward), run as the chapter's script; a run stored under load",
)
def test_a_pipeline_whose_stages_take_turns_fails(stored_flips: Callable) -> None:
    data = resnet.run(repeats=1, swap=(PIPELINE, TAKING_TURNS), splits=(8, 16))
    stored_flips(resnet.verdict, resnet.NAME, data)
