"""The hybrid runner on the suite's device: every (dp, pp, tp) layout of the world
that TinyGPT admits trains with HybridGPT as one process on the same device does:
the losses of every step and the parameters after them.

HybridGPT steps with AdamW, which divides each gradient by the root of its running
square: rounding noise in a parameter whose gradient is almost zero grows to the
size of a step. Losses are compared at TOL x 10 and parameters at TOL x 100 (the
unit tests measured 5e-7 and 2e-5 on the CPU), a step being lr = 1e-2: a wrong
gradient moves a parameter by that much in one step.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from gpu_suite import TOL, run

from distcourse import runtime
from distcourse.examples.gpt import GPTConfig, TinyGPT, token_batches, train_lm
from distcourse.parallel import hybrid
from distcourse.parallel.hybrid.check import SKIP

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
    device = runtime.device()
    mesh = hybrid.make_mesh(layout, CFG)
    torch.manual_seed(0)
    model = TinyGPT(CFG)
    micro = 2 if layout.pp > 1 else 1
    net = hybrid.HybridGPT(model, mesh, micro_batches=micro)  # its copy, on device
    assert all(p.device == device for p in net.module.parameters())
    batches = token_batches(STEPS, BATCH, CFG, seed=0)
    losses = net.train(batches)
    mine = net.one_process_state()  # this rank's stage, tp slices gathered
    net.close()
    alone = train_lm(
        model.to(device), [(x.to(device), y.to(device)) for x, y in batches]
    )
    want = model.state_dict()
    worst = max(
        (mine[k].to(device) - want[k]).abs().max().item()
        for k in mine
        if not k.endswith(SKIP)  # its true gradient is 0: noise only (check.py)
    )
    return {
        "loss": max(abs(a - b) for a, b in zip(losses, alone, strict=True)),
        "parameters": worst,
    }


def _against_one_process() -> dict[str, dict[str, float]]:
    return {lay.name: _train(lay) for lay in _layouts(dist.get_world_size())}


def test_hybrid_layouts_train_as_one_process(world: int) -> None:
    names = [lay.name for lay in _layouts(world)]
    for rank, found in enumerate(run(_against_one_process, world)):
        assert list(found) == names, (rank, found)
        for name, got in found.items():
            assert got["loss"] <= 10 * TOL, (rank, name, got)
            assert got["parameters"] <= 100 * TOL, (rank, name, got)
