"""Chapter 13's fault drill: one rank killed with SIGKILL in the middle of a step.

`train_gpt.py --kill RANK:STEP` makes rank RANK send itself SIGKILL during the
forward pass of step STEP (counted from 1), on torchrun's first attempt only
(`TORCHELASTIC_RESTART_COUNT` is 0 or unset), so the restarted group trains on.
SIGKILL, as `kill -9` or a lost node: the rank runs no handler, closes nothing
and writes no checkpoint. Its peers are left inside a collective; torchrun
(`--max-restarts 1`) sees the dead worker, stops the others and starts the whole
group again, and the trainer resumes from its newest complete checkpoint.
"""

from __future__ import annotations

import os
import signal

from torch import nn
from torch.utils.hooks import RemovableHandle


def parse(text: str) -> tuple[int, int]:
    """'RANK:STEP' as two ints (rank >= 0, step >= 1); ValueError otherwise."""
    rank, sep, step = text.partition(":")
    if not sep or not rank.isdigit() or not step.isdigit() or int(step) < 1:
        raise ValueError(f"--kill {text!r}: expected RANK:STEP, e.g. 1:5")
    return int(rank), int(step)


def first_attempt() -> bool:
    """True on torchrun's first attempt (or without torchrun)."""
    return os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"


def kill_in_forward(module: nn.Module) -> RemovableHandle:
    """Arm `module`: its next forward pass kills this process (SIGKILL)."""

    def die(*_: object) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    return module.register_forward_pre_hook(die)
