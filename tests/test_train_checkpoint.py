"""Checkpoints on real gloo ranks: sharded (each rank writes its own slices, no
gather), a crash mid-save leaves the last good one, a resumed run's losses equal
an uninterrupted run's bit for bit (SGD and AdamW on 1x2x2, AdamW under ZeRO-1
and FSDP), a run resumes on fewer ranks in another layout (8 -> 4: 2x2x2 to
FSDP; 4 -> 2: 2x1x2 ZeRO-2 to a pipeline) within TOL_OTHER_LAYOUT, a step saved
twice never leaves a gap, and only the newest `keep` stay."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch.distributed.checkpoint as dcp

from distcourse.launch import spawn
from distcourse.train import Corpus, RunConfig, Trainer, TrainLayout, checkpoint, latest

CORPUS = Corpus.from_text(
    "Ranks agree on every step, or they wait for each other. " * 40
)
PIPE_TP = TrainLayout(dp=1, pp=2, tp=2, micro_batches=2)  # 4 ranks
TOL_OTHER_LAYOUT = 1e-5  # float32 sums in another order (measured below 1e-6)


class Crash(RuntimeError):
    """The fault planted mid-save."""


def _crash() -> None:
    raise Crash("killed after the tensors were written")


def _run(optimizer: str, ckpt_dir: str | None) -> RunConfig:
    lr = 0.5 if optimizer == "sgd" else 1e-2
    return RunConfig(
        steps=6,
        batch=4,
        seq=16,
        lr=lr,
        optimizer=optimizer,
        warmup=5,  # a resume at step 3 is mid warm-up: the scheduler matters
        n_layer=2,
        ckpt_dir=ckpt_dir,
        log_every=0,
        quiet=True,
    )


def _resume_same_layout(root: str) -> dict:
    found = {}
    runs = (
        (PIPE_TP, "sgd"),
        (PIPE_TP, "adamw"),
        (TrainLayout(dp=4, zero=1), "adamw"),
        (TrainLayout(dp=2, tp=2, fsdp=True), "adamw"),
    )
    for layout, opt in runs:
        ckpt = os.path.join(root, f"{opt}-{layout.name}")
        whole = Trainer(layout, _run(opt, None), CORPUS)
        straight = whole.fit()
        whole.close()
        first = Trainer(layout, _run(opt, ckpt), CORPUS)
        first.fit(3)
        first.save()
        first.step()
        try:
            first.save(after_write=_crash)  # dies before the rename
        except Crash:
            pass
        first.close()
        listing = sorted(os.listdir(ckpt))
        again = Trainer(layout, _run(opt, ckpt), CORPUS)
        start = again.start
        resumed = again.fit()
        again.close()
        found[f"{opt} {layout.name}"] = (straight, resumed, start, listing)
    return found


def test_crash_mid_save_then_resume_is_bit_identical(tmp_path: Path) -> None:
    found = spawn(_resume_same_layout, 4, str(tmp_path), timeout=120)[0]
    for opt, (straight, resumed, start, listing) in found.items():
        assert listing == [".tmp_step_4", "step_3"], opt  # the crash left no step_4
        assert start == 3
        assert resumed == straight, opt  # bit for bit: the same floats
    assert len(found) == 4
    sgd = tmp_path / "sgd-1x2x2 m2 1f1b"
    assert latest(sgd) == sgd / "step_3"


def test_each_rank_writes_its_own_slices(tmp_path: Path) -> None:
    """1x1x2: the head's two halves are two chunks of the saved tensor, one per TP
    rank, each of half its rows; a norm both hold is written once."""
    spawn(_saved, 2, str(tmp_path), timeout=60)
    saved = dcp.FileSystemReader(tmp_path / "step_1").read_metadata()
    keys = saved.state_dict_metadata
    heads = sorted(k for k in keys if k.startswith("model.head.weight@"))
    vocab, width = keys[heads[0]].size
    assert heads == ["model.head.weight@0,0", f"model.head.weight@{vocab},0"]
    assert [k for k in keys if k.startswith("model.ln_f.weight@")] == [
        "model.ln_f.weight@0"
    ]
    assert {f"optim.exp_avg.head.weight@{vocab},0", "rng.0", "rng.1"} <= set(keys)


def _saved(root: str) -> None:
    trainer = Trainer(TrainLayout(tp=2), _run("adamw", root), CORPUS)
    trainer.fit(1)
    trainer.save()
    trainer.close()


def _save(root: str, layout: TrainLayout) -> list[float]:
    run = _run("adamw", root)
    whole = Trainer(layout, replace(run, ckpt_dir=None), CORPUS)
    straight = whole.fit()
    whole.close()
    first = Trainer(layout, replace(run, ckpt_every=3), CORPUS)
    first.fit(3)
    first.close()
    return straight


def _resume(root: str, layout: TrainLayout) -> tuple[int, list[float]]:
    again = Trainer(layout, _run("adamw", root), CORPUS)
    losses = again.fit()
    again.close()
    return again.start, losses


@pytest.mark.parametrize(
    ("saved", "resumed_on"),
    [
        (TrainLayout(dp=2, tp=2, zero=2), TrainLayout(pp=2, micro_batches=2)),
        (TrainLayout(dp=2, pp=2, tp=2, micro_batches=2), TrainLayout(dp=4, fsdp=True)),
    ],
    ids=["2x1x2 zero2 to 1x2x1", "2x2x2 to fsdp"],
)
def test_a_run_resumes_on_fewer_ranks_in_another_layout(
    tmp_path: Path, saved: TrainLayout, resumed_on: TrainLayout
) -> None:
    straight = spawn(_save, saved.world, str(tmp_path), saved, timeout=90)[0]
    found = spawn(_resume, resumed_on.world, str(tmp_path), resumed_on, timeout=90)
    start, resumed = found[0]
    assert start == 3
    assert resumed[:3] == straight[:3]  # the losses recorded before the save
    assert resumed[3:] == pytest.approx(straight[3:], abs=TOL_OTHER_LAYOUT, rel=0)


def _saved_twice(root: str) -> list[list[str]]:
    run = replace(_run("sgd", root), keep=2)
    trainer = Trainer(TrainLayout(dp=2), run, CORPUS)
    listings = []
    for step in (1, 1, 2, 3):
        if trainer.step_no < step:
            trainer.step()
        trainer.save()
        listings.append(sorted(p.name for p in Path(root).iterdir()))
    trainer.close()
    return listings


def test_a_step_saved_twice_gets_a_new_name_and_only_the_newest_stay(
    tmp_path: Path,
) -> None:
    listings = spawn(_saved_twice, 2, str(tmp_path), timeout=60)[0]
    assert listings == [
        ["step_1"],
        ["step_1", "step_1.1"],  # the old one stays until the new is whole
        ["step_1.1", "step_2"],  # keep=2: the oldest goes
        ["step_2", "step_3"],
    ]
    assert latest(tmp_path) == tmp_path / "step_3"
    assert checkpoint.order(Path("step_1.1")) > checkpoint.order(Path("step_1"))


def _rng_keys() -> list[str | None]:
    saved = {"rng.0", "rng.1", "cuda_rng.0", "model.tok.weight@0,0"}
    from torch import distributed as dist

    rank = dist.get_rank()
    return [
        checkpoint.rng_key(saved, "rng", rank),
        checkpoint.rng_key(saved, "cuda_rng", rank),  # a run on 1 GPU: rank 0's
        checkpoint.rng_key({"rng.0"}, "cuda_rng", rank),  # a run on CPUs: none
    ]


def test_each_rank_takes_its_rng_or_rank_0s_or_none() -> None:
    assert spawn(_rng_keys, 2) == [
        ["rng.0", "cuda_rng.0", None],
        ["rng.1", "cuda_rng.0", None],
    ]
    assert checkpoint.parse("optim.exp_avg.head.weight@16,0") == (
        "exp_avg",
        "head.weight",
        (16, 0),
    )
