"""Pipeline parallelism on the suite's device: stages cut from one model and run by
`Pipeline` under GPipe, 1F1B and interleaved 1F1B give one process's loss and every
gradient on the same device. A pipeline needs 2 ranks, so on NCCL 2 GPUs: a box with
one GPU skips it, and says so."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from gpu_suite import TOL, diff, run
from torch import nn

from distcourse import runtime
from distcourse.parallel import pipeline as pp

MICRO = 4  # micro-batches per step
MAKERS = {
    "GPipe": lambda p: pp.gpipe(p, MICRO),
    "1F1B": lambda p: pp.one_f_one_b(p, MICRO),
    "interleaved": lambda p: pp.interleaved(p, MICRO, 2),
}


def _model(device: torch.device) -> nn.Sequential:
    torch.manual_seed(0)
    layers = [nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(16)]
    return nn.Sequential(*layers).to(device)


def _against_one_process() -> dict[str, float]:
    """Each schedule's loss (last stage's rank) and this rank's gradients."""
    device, p = runtime.device(), dist.get_world_size()
    gen = torch.Generator().manual_seed(1)
    x, y = (torch.randn(8, 8, generator=gen).to(device) for _ in range(2))
    ref = _model(device)
    want = F.mse_loss(ref(x), y)
    want.backward()
    found = {}
    for name, make in MAKERS.items():
        schedule = make(p)
        stages = pp.split_by_count(_model(device), schedule.stages)
        pipe = pp.Pipeline(stages, schedule, F.mse_loss, timeout=30)
        loss = pipe.step(x, y)
        pipe.close()
        if loss is not None:
            found[f"{name} loss"] = diff(loss.detach(), want.detach())
        refs = pp.split_by_count(ref, schedule.stages)
        found[f"{name} gradients"] = max(
            diff(a.grad, b.grad)
            for s in pipe.local
            for a, b in zip(stages[s].parameters(), refs[s].parameters(), strict=True)
        )
    return found


def test_pipeline_schedules_equal_one_process(world: int) -> None:
    if world < 2:
        pytest.skip("a pipeline needs 2 ranks: 2 GPUs on NCCL")
    results = run(_against_one_process, world)
    assert all(f"{n} loss" in results[-1] for n in MAKERS)  # the last stage's rank
    for rank, found in enumerate(results):
        assert max(found.values()) <= TOL, (rank, found)
