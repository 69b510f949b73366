"""`--compare` on real gloo ranks: every layout the trainer accepts trains as one
process does (step 1's gradients and every step's loss within TOL): all layouts of
8 ranks with SGD, all of 4 with AdamW, activation checkpointing, the GPipe
schedule, and FSDP (or ZeRO-3, the same) on a data-parallel layout."""

from __future__ import annotations

from dataclasses import replace

import torch.distributed as dist

from distcourse.launch import spawn
from distcourse.train import (
    TOL,
    Corpus,
    RunConfig,
    TrainLayout,
    accepted,
    against_one_process,
    verdicts,
)

CORPUS = Corpus.from_text(
    "Ranks agree on every step, or they wait for each other. " * 40
)
SGD = RunConfig(steps=2, batch=8, seq=16, optimizer="sgd", lr=0.5, quiet=True)
ADAMW = replace(SGD, optimizer="adamw", lr=1e-2, warmup=2)


def _every_layout(run: RunConfig, extra: list[TrainLayout]) -> list[dict]:
    world = dist.get_world_size()
    layouts = accepted(world, run.model(CORPUS), run.batch) + extra
    return [against_one_process(lay, run, CORPUS) for lay in layouts]


def _assert_all_pass(found: list[dict], names: list[str]) -> None:
    assert [f["layout"] for f in found] == names
    for f in found:
        assert f["grad_diff"] <= TOL["gradients"], f
        assert f["loss_diff"] <= TOL["losses"], f
        assert all(line.endswith("PASS") for line in verdicts(f)), verdicts(f)
        assert f["losses"][-1] < f["losses"][0]  # it learns


def test_every_layout_of_8_ranks_trains_as_one_process_with_sgd() -> None:
    extra = [TrainLayout(dp=8, fsdp=True)]
    found = spawn(_every_layout, 8, SGD, extra, timeout=60)[0]
    _assert_all_pass(
        found,
        [
            "8x1x1",
            "4x2x1 m2 1f1b",
            "4x1x2",
            "2x4x1 m2 1f1b",
            "2x2x2 m2 1f1b",
            "2x1x4",
            "1x4x2 m2 1f1b",
            "1x2x4 m2 1f1b",
            "8x1x1 fsdp",
        ],
    )


def test_adamw_and_activation_checkpointing_on_4_ranks() -> None:
    extra = [
        TrainLayout(dp=1, pp=2, tp=2, micro_batches=2, ckpt="full"),
        TrainLayout(dp=2, pp=2, micro_batches=2, schedule="gpipe"),
        TrainLayout(dp=4, fsdp=True),
        TrainLayout(dp=4, zero=3),
    ]
    found = spawn(_every_layout, 4, ADAMW, extra, timeout=60)[0]
    _assert_all_pass(
        found,
        [
            "4x1x1",
            "2x2x1 m2 1f1b",
            "2x1x2",
            "1x4x1 m2 1f1b",
            "1x2x2 m2 1f1b",
            "1x1x4",
            "1x2x2 m2 1f1b ckpt=full",
            "2x2x1 m2 gpipe",
            "4x1x1 fsdp",
            "4x1x1 zero3",
        ],
    )
