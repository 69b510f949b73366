"""Resuming mid-epoch gives bit-identical losses; forgetting any one part does not."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import SequentialSampler

from distcourse.examples import checkpoint
from distcourse.launch import spawn

STOP = 6  # 64 samples / 2 ranks / batch 8 = 4 steps an epoch: stop in epoch 1


def test_skip_sampler_drops_what_was_consumed() -> None:
    rest = checkpoint.SkipSampler(SequentialSampler(range(10)), 4)
    assert list(rest) == [4, 5, 6, 7, 8, 9] and len(rest) == 6


def test_rng_states_round_trip() -> None:
    checkpoint.seed_all(3)
    saved = checkpoint.rng_states()
    first = checkpoint.augment(torch.zeros(2)), torch.rand(1)
    checkpoint.set_rng_states(saved)
    again = checkpoint.augment(torch.zeros(2)), torch.rand(1)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))


def _runs(path: str) -> dict[str, list[float]]:
    full = checkpoint.train(path + ".unused")
    first = checkpoint.train(path, stop_after=STOP)
    runs = {"full": full, "first": first}
    runs["resumed"] = checkpoint.train(path, resume=True)
    for part in checkpoint.PARTS:
        runs[part] = checkpoint.train(path, resume=True, forget=[part])
    return runs


def test_resume_mid_epoch_is_bit_identical_and_each_part_matters(
    tmp_path: Path,
) -> None:
    for runs in spawn(_runs, 2, str(tmp_path / "ckpt.pt")):
        assert len(runs["full"]) == 12 and runs["first"] == runs["full"][:STOP]
        assert runs["resumed"] == runs["full"][STOP:]  # exact, float for float
        for part in checkpoint.PARTS:  # without it, the numbers change
            assert runs[part] != runs["full"][STOP:], part


def test_forget_names_only_known_parts() -> None:
    with pytest.raises(ValueError, match="unknown parts"):
        checkpoint.train("x", forget=["optimiser"])
