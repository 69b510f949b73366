"""Negative controls of chapter 3b: its own cells (PyTorch's DDP tutorial with our
DDP swapped in, OneFlow's toy model on two halves, Paddle's quick start, the
sampler's epochs, a checkpoint resumed mid-epoch), run with a fault planted, must
turn each verdict they print from PASS to FAIL.

The faults: the tutorial's swapped-in DDP one that never copies rank 0's weights or
one that sums the gradients (tests/controls/ddp_faults.py, imported by the script
the cell runs); our DDP summing in the chapter's own spawns; Adam given another
model's parameters; set_epoch(1) forgotten; a resume that does not restore the
random generators. The cells start their own ranks and scripts; the harness plants
the faults there too (tests/controls/harness.py). Lines as written: the stored
notebook's.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ddp_faults
import harness
from harness import Fault, Plant, Swap

from distcourse.examples import checkpoint
from distcourse.launch import script
from distcourse.parallel import ddp

CHAPTER = harness.Chapter(
    "03b_ddp_in_practice",
    setup=['TUTORIAL = "scripts/ddp_tutorial.py"'],
    here="import os, tempfile, torch\n"
    "from distcourse import checks, runtime\n"
    "from distcourse.examples import datasets, models, train\n"
    "from distcourse.launch import columns, spawn\n"
    "from torch.utils.data import DataLoader, DistributedSampler\n",
    ranks=0,
    stored=True,
)
TUTORIAL = ["torch_dir, ours_dir = tempfile.mkdtemp()", "swap = (script.TORCH_DDP"]
HALVES = ["for bad in (dict(device_ids=[0])", "def toy_model_halves():", "halves = [(a"]
PADDLE = ["def paddle_quickstart(", "per_rank = spawn(paddle_quickstart, 2)"]
RESUME = [
    "def stop_midway(path):",
    "before = spawn(stop_midway, 2, path)",
    "def resume_report(",
]
HERE = str(Path(__file__).resolve().parent)  # where ddp_faults is


def with_controls(child_env: Callable) -> Callable:
    """A script's environment with this folder on its path (for ddp_faults)."""

    def env(tmp: str, extra: dict[str, str] | None = None) -> dict[str, str]:
        out = child_env(tmp, extra)
        out["PYTHONPATH"] = os.pathsep.join([HERE, out["PYTHONPATH"]])
        return out

    return env


def swapped_in(faulty: str) -> Swap:
    """The cell's swap of the tutorial's import, to a faulty DDP instead of ours."""
    return Swap(
        "swap = (script.TORCH_DDP, script.OUR_DDP)",
        f'swap = (script.TORCH_DDP, "from ddp_faults import {faulty} as DDP")',
    )


def without_rng(train: Callable) -> Callable:
    """The checkpoint's resume without the random generators' states."""

    def faulty(path: Any, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("resume") and not kwargs.get("forget"):
            kwargs["forget"] = ["rng"]
        return train(path, *args, **kwargs)

    return functools.wraps(train)(faulty)


CHILD_ENV = Plant(script, "child_env", with_controls, wrap=True)
FAULTS = {
    "unsynced": Fault(TUTORIAL, swapped_in("UnsyncedDDP"), CHILD_ENV),
    "summing": Fault(TUTORIAL, swapped_in("SummingDDP"), CHILD_ENV),
    "our DDP summing": Fault(HALVES, Plant(ddp, "DDP", ddp_faults.SummingDDP)),
    "stranger": Fault(
        PADDLE,
        Swap(
            "    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)"
            "  # no wrapper",
            "    optimizer = torch.optim.Adam(models.SmallCNN().parameters())",
        ),
    ),
    "set_epoch forgotten": Fault(
        ["set_epoch(1) changed the order"], Swap("sampler.set_epoch(1)", "")
    ),
    "rng not restored": Fault(RESUME, Plant(checkpoint, "train", without_rng, True)),
}


CONTROLS = harness.Controls(
    "03b_ddp_in_practice",
    test_a_ddp_that_never_syncs_fails_the_swap=harness.Flip(
        ["unsynced"],
        r"every line as with torch's DDP: True",
        "the swapped-in DDP never copies rank 0's weights to rank 1 (init_sync=False)",
    ),
    test_a_ddp_that_sums_fails_the_swap=harness.Flip(
        ["summing"],
        r"parameters identical to torch DDP's, bit for bit: True",
        "the swapped-in DDP sums the gradients instead of averaging them",
    ),
    test_halves_summed_are_not_the_whole=harness.Flip(
        ["our DDP summing"],
        r"parameters vs 1 process: <= 1e-06: PASS",
        "DDP's gradients summed over the 2 ranks, not averaged",
        r"mean of the 2 ranks' losses vs 1 process: <= 1e-06: PASS",
        "DDP's gradients summed over the 2 ranks, not averaged",
    ),
    test_an_optimizer_on_the_wrong_model_learns_nothing=harness.Flip(
        ["stranger"],
        r"mean loss of its last 4 steps below half of its first 4: True",
        "Adam given another model's parameters: the trained model never moves",
    ),
    test_a_forgotten_set_epoch_fails=harness.Flip(
        ["set_epoch forgotten"],
        r"set_epoch\(1\) changed the order",
        "set_epoch(1) forgotten before epoch 1",
    ),
    test_a_resume_without_the_generators_differs=harness.Flip(
        ["rng not restored"],
        r"resumed == uninterrupted, float for float: True",
        "the generators' states not restored: dropout and augmentation draw anew",
    ),
)
globals().update(CONTROLS.tests())
