"""The trainer on real gloo ranks: checkpoints every N steps, a resume refused
when the checkpoint was written for another run, the eval loss every N steps on
the held-out split, metrics records, and the warm-up and cosine schedule."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from distcourse.launch import spawn
from distcourse.runtime import RankError
from distcourse.train import Corpus, RunConfig, Trainer, TrainLayout
from distcourse.train.trainer import lr_factor

CORPUS = Corpus.from_text("Every rank holds its share of the batch. " * 30)
RUN = RunConfig(steps=4, batch=4, seq=8, n_layer=2, ckpt_every=2, quiet=True)


def _fit(root: str, seed: int) -> tuple[list[float], list[str]]:
    run = replace(RUN, ckpt_dir=root, seed=seed)
    trainer = Trainer(TrainLayout(dp=2), run, CORPUS)
    losses = trainer.fit()
    trainer.close()
    return losses, sorted(p.name for p in Path(root).iterdir())


def test_checkpoints_every_n_steps_and_refuses_another_runs(tmp_path: Path) -> None:
    losses, names = spawn(_fit, 2, str(tmp_path), 0, timeout=60)[0]
    assert len(losses) == 4 and names == ["step_2", "step_4"]
    with pytest.raises(RankError, match="checkpoint seed is 0, this run's is 1"):
        spawn(_fit, 2, str(tmp_path), 1, timeout=60)


def _eval_and_metrics(path: str) -> tuple[dict, list]:
    run = replace(RUN, ckpt_every=0, eval_every=2, eval_batches=2, metrics=path)
    trainer = Trainer(TrainLayout(pp=2, micro_batches=2), run, CORPUS)
    trainer.fit()
    evals = dict(trainer.evals)
    again = trainer.evaluate()  # the same held-out windows: the same loss
    trainer.close()
    return evals, [again]


def test_eval_loss_every_n_steps_and_a_metrics_line_per_logged_step(
    tmp_path: Path,
) -> None:
    path = tmp_path / "run.jsonl"
    evals, (again,) = spawn(_eval_and_metrics, 2, str(path), timeout=60)[0]
    assert sorted(evals) == [2, 4] and again == evals[4]
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r.get("eval_loss") for r in rows] == [None, evals[2], None, evals[4]]
    for key in ("loss", "lr", "tokens_per_s", "step_ms", "peak_bytes", "planned_bytes"):
        assert all(key in r for r in rows), key
    assert rows[0]["mfu"] is None  # a CPU has no datasheet peak
    assert len(rows[0]["peak_bytes"]) == 2 and all(b > 0 for b in rows[0]["peak_bytes"])


def test_warmup_then_cosine_decay_to_the_floor() -> None:
    factor = lr_factor(RunConfig(steps=10, warmup=4, min_lr=0.1))
    assert [factor(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert factor(7) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 2)))
    assert factor(10) == factor(20) == pytest.approx(0.1)
    assert lr_factor(RunConfig(steps=3, warmup=0))(0) == 1.0


def _evals() -> dict[str, tuple[float, float]]:
    from distcourse.examples.gpt import lm_loss
    from distcourse.train import model as model_mod

    run = replace(RUN, ckpt_every=0, eval_every=1, eval_batches=2, n_layer=4)
    whole = model_mod.one_process(run.model(CORPUS), run.seed)
    found = {}
    layouts = (
        TrainLayout(pp=2, micro_batches=2, schedule="interleaved", virtual=2),
        TrainLayout(tp=2),
        TrainLayout(dp=2, fsdp=True, dtype="bf16"),
        TrainLayout(dp=2, zero=1),
    )
    for layout in layouts:
        trainer = Trainer(layout, run, CORPUS)
        mine = trainer.held  # this rank's rows of each held-out batch
        shares = [None] * dist.get_world_size()
        dist.all_gather_object(shares, mine)
        if layout.dp == 1:  # every rank holds the whole batch
            shares = shares[:1]
        batches = [
            (torch.cat([s[i][0] for s in shares]), torch.cat([s[i][1] for s in shares]))
            for i in range(len(mine))
        ]
        with torch.no_grad():
            losses = [lm_loss(whole(x), y).item() for x, y in batches]
        found[layout.name] = (trainer.evaluate(), sum(losses) / len(losses))
        trainer.close()
    return found


def test_the_eval_loss_is_one_processes_forward_on_every_layout() -> None:
    for name, (ours, alone) in spawn(_evals, 2, timeout=60)[0].items():
        tol = 2e-2 if "bf16" in name else 1e-5  # FSDP's bf16 parameters
        assert abs(ours - alone) <= tol, (name, ours, alone)
