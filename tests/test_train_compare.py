"""`--compare-all` on 8 real gloo ranks: every layout of 8 ranks and every way of
running its parts trains as one process does, in float32 (within 1e-5) and in
bf16 (within compare.TOL's measured relative bounds): one spawn for all.

The model has 8 blocks and 8 heads, so every dp x pp x tp grid of 8 ranks is
accepted (1x8x1 and 1x1x8 too); on 8x1x1 and 2x2x2 each composition runs as
well: ZeRO-1, ZeRO-2 (FlatZero), FSDP (FSDP x TP on 2x2x2, FSDP x PP x TP),
FSDP with activation checkpointing, checkpointing, accumulated micro-batches,
GPipe and interleaved 1F1B. SGD (a gradient of the wrong scale shows), then
AdamW on the compositions whose optimizer differs (pieces: ZeRO, FSDP)."""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.distributed as dist

from distcourse.launch import spawn
from distcourse.train import Corpus, RunConfig, TrainLayout, against_one_process
from distcourse.train.compare import against_each, verdicts
from distcourse.train.layout import compositions

CORPUS = Corpus.from_text(
    "Ranks agree on every step, or they wait for each other. " * 40
)
# one SGD step compares step 1's gradients, its loss and the parameters it made;
# 8 heads let TP 8 split them; 8 blocks, for 8 pipeline stages, only in 1x8x1
SGD = RunConfig(
    steps=1, batch=16, seq=16, optimizer="sgd", lr=0.5, n_layer=4, n_head=8, log_every=0
)
EIGHT = replace(SGD, n_layer=8)
ADAMW = replace(SGD, steps=2, optimizer="adamw", lr=1e-2, warmup=1, clip=1.0)
GRIDS = [
    "8x1x1",
    "4x2x1 m2 1f1b",
    "4x1x2",
    "2x4x1 m2 1f1b",
    "2x2x2 m2 1f1b",
    "2x1x4",
    "1x8x1 m2 1f1b",
    "1x4x2 m2 1f1b",
    "1x2x4 m2 1f1b",
    "1x1x8",
]


def _every(dtype: str) -> list[dict]:
    """float32: every composition; bf16: every grid, the compositions on 8x1x1
    and FSDP x PP x TP (FSDP's own bf16 policy) on 2x2x2."""
    world = dist.get_world_size()
    layouts = compositions(world, SGD.model(CORPUS), SGD.batch, dtype)
    if dtype == "bfloat16":
        grids = len(GRIDS) - 1
        layouts = [
            lay
            for i, lay in enumerate(layouts)
            if i < grids or lay.pp * lay.tp == 1 or lay.name.endswith("fsdp bf16")
        ]
    eight = TrainLayout(pp=8, micro_batches=2, dtype=dtype)
    found = against_each(layouts, SGD, CORPUS)
    return [*found[:6], against_one_process(eight, EIGHT, CORPUS), *found[6:]]


def _all() -> dict[str, list[dict]]:
    torch.set_num_threads(1)
    adamw = [
        TrainLayout(dp=2, pp=2, tp=2, micro_batches=2, zero=1),
        TrainLayout(dp=4, tp=2, fsdp=True, dtype="bf16"),
        TrainLayout(dp=2, pp=2, tp=2, micro_batches=2, zero=2, ckpt="full"),
    ]
    return dict(
        fp32=_every("float32"),
        bf16=_every("bfloat16"),
        adamw=against_each(adamw, ADAMW, CORPUS),
    )


def test_every_layout_and_composition_of_8_ranks_trains_as_one_process() -> None:
    found = spawn(_all, 8, timeout=300, deadline=600)[0]
    for dtype in ("fp32", "bf16"):
        names = [f["layout"] for f in found[dtype]]
        suffix = "" if dtype == "fp32" else " bf16"
        assert names[: len(GRIDS)] == [g + suffix for g in GRIDS], names
        extras = " | ".join(names[len(GRIDS) :])
        for want in ("zero1", "zero2", "fsdp", "ckpt=full fsdp", "acc2"):
            assert f"8x1x1 {want}{suffix}" in names, (want, names)
        assert f"2x2x2 m2 1f1b fsdp{suffix}" in names, names
    for want in ("zero1", "zero2", "ckpt=full", "ckpt=full fsdp"):
        assert f"2x2x2 m2 1f1b {want}" in [f["layout"] for f in found["fp32"]]
    extras = " | ".join(f["layout"] for f in found["fp32"][len(GRIDS) :])
    assert "2x2x2 m4 gpipe" in extras and "2x2x2 m2 interleaved v2" in extras, extras
    for runs in found.values():
        for f in runs:
            lines = verdicts(f)
            assert all(line.endswith("PASS") for line in lines), lines
            if len(f["losses"]) > 1:
                assert f["losses"][-1] < f["losses"][0]  # it learns
