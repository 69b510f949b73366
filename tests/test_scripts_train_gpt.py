"""Chapter 13's script under torchrun: 2 gloo ranks as a pipeline (1x2x1) of 2
micro-batches train the book's text, --compare passes against one process (SGD,
then AdamW), checkpoints land in --ckpt-dir and the loss curve in --curve; a
second torchrun on 1 rank resumes where the first stopped (steps 5-6). More
layouts, and 8 ranks resumed on 4, run in process (test_train_compare.py,
test_train_checkpoint.py): each torchrun costs seconds of start-up. The refusals
before any rank starts (`--check`) are in test_train_cli.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from helpers import torchrun

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = "book/scripts/train_gpt.py"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "DISTCOURSE_DEVICE": "cpu"}
SMALL = ["--layers", "2", "--batch", "4", "--seq", "16", "--quiet"]


def _run(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=ENV,
        timeout=180,
        check=False,
    )


def test_two_ranks_compare_checkpoint_curve_then_resume_on_one(
    tmp_path: Path,
) -> None:
    ckpt, curve = tmp_path / "ckpt", tmp_path / "loss.png"
    layout = ["--dp", "1", "--pp", "2", "--micro-batches", "2"]
    first = _run(
        [*torchrun(2), SCRIPT, *layout, *SMALL, "--steps", "4", "--ckpt-every", "2"]
        + ["--ckpt-dir", str(ckpt), "--compare", "--compare-steps", "2"]
        + ["--curve", str(curve)]
    )
    assert first.returncode == 0, first.stderr[-3000:]
    lines = first.stdout.splitlines()
    verdicts = [line for line in lines if "difference" in line or "vs one" in line]
    assert len(verdicts) == 8 and all(v.endswith("PASS") for v in verdicts), lines
    assert lines[-2].startswith("1x2x1 m2 1f1b (dp x pp x tp) on 2 ranks, cpu;")
    assert "steps 1-4" in lines[-2]
    assert curve.read_bytes()[:4] == b"\x89PNG"
    assert sorted(p.name for p in ckpt.iterdir()) == ["step_2", "step_4"]
    resumed = _run(
        [*torchrun(1), SCRIPT, "--dp", "1", *SMALL, "--steps", "6"]
        + ["--ckpt-dir", str(ckpt)]
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "1x1x1 (dp x pp x tp) on 1 rank," in resumed.stdout
    assert "steps 5-6" in resumed.stdout
    assert sorted(p.name for p in ckpt.iterdir()) == ["step_2", "step_4", "step_6"]
