"""The hybrid runner on the suite's device: every (dp, pp, tp) layout of the world
that TinyGPT admits gives one process's gradients in its first step, and with plain
SGD one process's losses and parameters: `hybrid.against_one_process`, chapter 8's
check (its one-process run on the host, the hybrid's stages on the rank's device).

SGD, not AdamW: AdamW's step m / (sqrt(v) + eps) loses a constant gradient scale,
so a gradient summed over the replicas instead of averaged would still train like
one process (tests/controls/test_08_hybrid.py). The tolerances are the check's own
(hybrid.check.TOL), float32's rounding between two orders of summation.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from gpu_suite import run

from distcourse import runtime
from distcourse.examples.gpt import GPTConfig
from distcourse.parallel import hybrid
from distcourse.parallel.hybrid.check import TOL

CFG = GPTConfig()  # vocab 64, 2 blocks, 4 heads, 32 wide, 16 tokens
STEPS, BATCH = 3, 8


def _layouts(world: int) -> list[hybrid.Layout]:
    """The layouts of `world` ranks that CFG admits (2 blocks: pp <= 2)."""
    found = []
    for layout in hybrid.layouts(world):
        try:
            hybrid.check(layout, CFG, world)
        except ValueError:
            continue
        found.append(layout)
    return found


def _train(layout: hybrid.Layout) -> dict[str, float]:
    micro = 2 if layout.pp > 1 else 1
    found = hybrid.against_one_process(
        layout, CFG, steps=STEPS, batch=BATCH, micro_batches=micro, optimizer="sgd"
    )
    return {
        "gradients": found["grad_diff"],
        "loss": found["loss_diff"],
        "parameters": found["param_diff"],
        "covered": found["covered"],
        "on the rank's device": found["device"] == {str(runtime.device())},
    }


def _against_one_process() -> dict[str, dict[str, float]]:
    torch.set_num_threads(1)
    return {lay.name: _train(lay) for lay in _layouts(dist.get_world_size())}


def test_hybrid_layouts_train_as_one_process(world: int) -> None:
    names = [lay.name for lay in _layouts(world)]
    for rank, found in enumerate(run(_against_one_process, world)):
        assert list(found) == names, (rank, found)
        for name, got in found.items():
            assert got["gradients"] <= TOL["gradients"], (rank, name, got)
            assert got["loss"] <= TOL["losses"], (rank, name, got)
            assert got["parameters"] <= TOL["sgd"], (rank, name, got)
            assert got["covered"], (rank, name, got)
            assert got["on the rank's device"], (rank, name, got)
