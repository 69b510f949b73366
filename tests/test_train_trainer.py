"""The trainer on real gloo ranks: checkpoints every N steps, a resume refused
when the checkpoint was written for another run, and the warm-up."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from distcourse.launch import spawn
from distcourse.runtime import RankError
from distcourse.train import Corpus, RunConfig, Trainer, TrainLayout
from distcourse.train.trainer import warmup_factor

CORPUS = Corpus.from_text("Every rank holds its share of the batch. " * 30)
RUN = RunConfig(steps=4, batch=4, seq=8, n_layer=2, ckpt_every=2, quiet=True)


def _fit(root: str, seed: int) -> tuple[list[float], list[str]]:
    trainer = Trainer(TrainLayout(dp=2), replace(RUN, ckpt_dir=root, seed=seed), CORPUS)
    losses = trainer.fit()
    trainer.close()
    return losses, sorted(p.name for p in Path(root).iterdir())


def test_checkpoints_every_n_steps_and_refuses_another_runs(tmp_path: Path) -> None:
    losses, names = spawn(_fit, 2, str(tmp_path), 0, timeout=60)[0]
    assert len(losses) == 4 and names == ["step_2", "step_4"]
    with pytest.raises(RankError, match="checkpoint seed is 0, this run's is 1"):
        spawn(_fit, 2, str(tmp_path), 1, timeout=60)


def test_warmup_is_linear_then_flat() -> None:
    factor = warmup_factor(4)
    assert [factor(s) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert warmup_factor(0)(0) == 1.0
