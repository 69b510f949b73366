"""Chapter 13's trainer on the suite's device: every layout of the world and every
composition on it (`train.layout.compositions`: ZeRO-1/2, FSDP, checkpointing,
accumulation, the schedules; at 8 ranks the layouts alone) trains as one process
on the same device does, in float32 and in bf16 (`train.compare`, the trainer's
own check and tolerances: one SGD step compares step 1's gradients, its loss and
the parameters it made).

float32 is compared with TF32 off (the suite's ranks turn it off; the compare does
too). On an emulated box this holds the trainer to NCCL's and CUDA's rules: a host
tensor in a collective, or on the device in an op, fails here.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from gpu_suite import run

from distcourse.train import Corpus, RunConfig
from distcourse.train.compare import against_each, verdicts
from distcourse.train.layout import accepted, compositions

CORPUS = Corpus.from_text("Ranks agree on every step, or they wait. " * 40)
SGD = RunConfig(steps=1, batch=8, seq=16, optimizer="sgd", lr=0.5, n_layer=4, n_head=4)


def _every(dtype: str) -> list[tuple[str, list[str]]]:
    torch.set_num_threads(1)
    world = dist.get_world_size()
    cfg = SGD.model(CORPUS)
    layouts = compositions(world, cfg, SGD.batch, dtype)
    if world >= 8:  # the grids only (they come first): compositions ran at 2 and 4
        layouts = layouts[: len(accepted(world, cfg, SGD.batch))]
    return [(f["layout"], verdicts(f)) for f in against_each(layouts, SGD, CORPUS)]


def test_every_composition_trains_as_one_process(world: int) -> None:
    for dtype in ("float32", "bfloat16"):
        found = run(_every, world, dtype)[0]
        assert len(found) >= 4, found  # the grids and the compositions on them
        for name, lines in found:
            assert all(line.endswith("PASS") for line in lines), (name, lines)
