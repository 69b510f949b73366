"""Chapter 4's torchrun script: tensor-parallel training prints one process's losses."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import run_python, torchrun

from distcourse.examples.gpt import GPTConfig, TinyGPT, token_batches, train_lm


def _torchrun(*options: str) -> list[str]:
    """Run book/scripts/tp_train.py on 2 ranks; its stdout lines."""
    done = run_python(
        *torchrun(2), "book/scripts/tp_train.py", "--steps", "12", *options, timeout=180
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp+sp"])
def test_tp_script_trains_to_one_process_losses(sp: bool, tmp_path: Path) -> None:
    path = tmp_path / "gpt.pt"
    options = ["--compare", "--save", str(path)]
    lines = _torchrun(*options, *(["--sequence-parallel"] if sp else []))
    torch.manual_seed(0)  # what the script computes, here in one process
    model = TinyGPT(GPTConfig())
    alone = train_lm(model, token_batches(12, 8, GPTConfig()))
    total = sum(p.numel() for p in TinyGPT(GPTConfig()).parameters())
    want = f"TP=2: 12 steps, losses {alone[0]:.4f} -> {alone[-1]:.4f}, "
    assert [line[:8] for line in lines[:2]] == ["[rank 0]", "[rank 1]"]
    for line in lines[:2]:
        assert line[9:].startswith(want), (line, want)
        held = int(line.split(", ")[-1].split(" of ")[0].replace(",", ""))
        assert total / 2 < held < total, line  # split layers halved, the rest whole
        assert line.endswith(f"of {total:,} parameters on this rank")
    assert lines[2] == f"one process: losses {alone[0]:.4f} -> {alone[-1]:.4f}"
    assert lines[3] == "every loss equal to 4 decimals: True"
    saved = torch.load(path, weights_only=True)
    assert saved.keys() == model.state_dict().keys()  # a one-process checkpoint
    assert alone[-1] < alone[0] - 1  # it learns
