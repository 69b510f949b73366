"""Chapter 13's script, with and without torchrun.

- 2 gloo ranks as a pipeline (1x2x1) of 2 micro-batches train the book's text for
  8 steps: --compare passes against one process (SGD, then AdamW), and so does
  --compare-all (every layout of 2 ranks and every composition on them);
  checkpoints land every 2 steps in --ckpt-dir, the loss curve in --curve,
  losses in --losses, a JSON line of metrics per step in --metrics.
- The fault drill: the same run under `torchrun --max-restarts 1` with rank 1
  killed by SIGKILL in step 5's forward pass (--kill 1:5). torchrun restarts the
  group, it resumes from step_4, and its losses equal the uninterrupted run's bit
  for bit (CPU, same layout). Then 1 rank resumes its checkpoint for steps 7-8
  (another layout: within compare.TOL of the uninterrupted run).
- 8 ranks as 2 torchrun "nodes" x 4 processes on loopback (2x2x2) pass --compare
  (SGD: the AdamW comparison of every layout runs in process, test_train_compare).

- No torchrun: `python train_gpt.py --model gpt2-124m ...` (narrowed to 1 block
  on a small BPE corpus, for time) trains on one process and writes its metrics.

More layouts, and 8 ranks resumed on 4, run in process (test_train_compare.py,
test_train_checkpoint.py): each torchrun costs seconds of start-up. The refusals
before any rank starts (`--check`) are in test_train_cli.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from helpers import run_python, torchrun, two_nodes

from distcourse.train import TOL

SCRIPT = "book/scripts/train_gpt.py"
# frozen text (the book is edited as the tests run); no decay: a run of 6 steps
# resumed to 8 follows the same rates as one of 8
SMALL = ["--layers", "2", "--batch", "4", "--seq", "16", "--quiet", "--excerpt"]
SMALL += ["--min-lr", "1"]
PIPELINE = ["--dp", "1", "--pp", "2", "--micro-batches", "2"]


def _run(args: list[str]) -> subprocess.CompletedProcess:
    return run_python(*args, timeout=180)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """8 steps on 2 ranks, checkpointed every 2, compared against one process."""
    tmp = tmp_path_factory.mktemp("uninterrupted")
    ckpt, curve, losses = tmp / "ckpt", tmp / "loss.png", tmp / "losses.json"
    done = _run(
        [*torchrun(2), SCRIPT, *PIPELINE, *SMALL, "--steps", "8", "--ckpt-every", "2"]
        + ["--ckpt-dir", str(ckpt), "--compare", "--compare-steps", "2"]
        + ["--compare-all", "--curve", str(curve), "--losses", str(losses)]
        + ["--metrics", str(tmp / "run.jsonl")]
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(
        lines=done.stdout.splitlines(),
        ckpt=ckpt,
        curve=curve,
        losses=json.loads(losses.read_text()),
        metrics=(tmp / "run.jsonl").read_text().splitlines(),
    )


def _summary(lines: list[str]) -> str:
    (line,) = [ln for ln in lines if "(dp x pp x tp) on" in ln]
    return line


def test_two_ranks_compare_checkpoint_and_curve(uninterrupted: dict) -> None:
    lines = uninterrupted["lines"]
    verdicts = [line for line in lines if line.endswith(("PASS", "FAIL"))]
    assert all(v.endswith("PASS") for v in verdicts), lines
    every = [line for line in lines if "layouts:" in line]
    assert every == ["9 layouts: 27 of 27 checks PASS"]  # 3 grids, 6 on 2x1x1
    after = lines[lines.index(every[0]) + 1 :]  # --compare's, after --compare-all's
    mine = [line for line in after if line.endswith("PASS")]
    assert len(mine) == 8, mine  # the run's own: 2 + 3 SGD lines, 2 + 1 AdamW
    summary = _summary(lines)
    assert summary.startswith("1x2x1 m2 1f1b (dp x pp x tp) on 2 ranks, cpu;")
    assert "steps 1-8" in summary
    rows = [json.loads(line) for line in uninterrupted["metrics"]]
    assert [r["step"] for r in rows] == list(range(1, 9))
    assert uninterrupted["curve"].read_bytes()[:4] == b"\x89PNG"
    names = sorted(p.name for p in uninterrupted["ckpt"].iterdir())
    assert names == ["step_2", "step_4", "step_6", "step_8"]
    assert len(uninterrupted["losses"]) == 8


def test_a_rank_killed_mid_step_restarts_and_resumes_bit_identically(
    uninterrupted: dict, tmp_path: Path
) -> None:
    ckpt, losses = tmp_path / "ckpt", tmp_path / "losses.json"
    killed = _run(
        [*torchrun(2), "--max-restarts", "1", SCRIPT, *PIPELINE, *SMALL]
        + ["--steps", "6", "--ckpt-every", "2", "--ckpt-dir", str(ckpt)]
        + ["--kill", "1:5", "--losses", str(losses)]
    )
    assert killed.returncode == 0, killed.stderr[-3000:]
    assert "exitcode: -9" in killed.stderr  # torchrun saw rank 1 die by SIGKILL
    assert "waiting for a gradient from rank 1" in killed.stderr  # rank 0's error
    assert "steps 5-6" in _summary(killed.stdout.splitlines())  # from step_4
    assert json.loads(losses.read_text()) == uninterrupted["losses"][:6]
    resumed = _run(
        [*torchrun(1), SCRIPT, "--dp", "1", *SMALL, "--steps", "8"]
        + ["--ckpt-dir", str(ckpt), "--losses", str(losses)]
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "1x1x1 (dp x pp x tp) on 1 rank," in resumed.stdout
    assert "steps 7-8" in _summary(resumed.stdout.splitlines())
    assert sorted(p.name for p in ckpt.iterdir()) == [f"step_{s}" for s in (2, 4, 6, 8)]
    found, expected = json.loads(losses.read_text()), uninterrupted["losses"]
    assert found[:6] == expected[:6]
    gap = max(abs(a - b) for a, b in zip(found, expected, strict=True))
    assert gap < TOL["float32"]["losses"]


def test_two_nodes_of_four_ranks_on_loopback_compare() -> None:
    nodes = two_nodes(
        [SCRIPT, "--dp", "2", "--pp", "2", "--tp", "2", "--micro-batches", "2"]
        + [*SMALL, "--steps", "1", "--optimizer", "sgd"]
        + ["--compare", "--compare-steps", "2"],
        "train-gpt-test",
    )
    for status, _, err in nodes:
        assert status == 0, err[-3000:]
    lines = max((out.splitlines() for _, out, _ in nodes), key=len)
    verdicts = [line for line in lines if line.endswith(("PASS", "FAIL"))]
    assert len(verdicts) == 5 and all(v.endswith("PASS") for v in verdicts), lines
    assert _summary(lines).startswith("2x2x2 m2 1f1b (dp x pp x tp) on 8 ranks, cpu;")


def test_one_process_without_torchrun_writes_its_metrics(tmp_path: Path) -> None:
    metrics, board, traces = (tmp_path / n for n in ("m.jsonl", "tb", "traces"))
    done = _run(
        [SCRIPT, "--model", "gpt2-124m", "--n-layer", "1", "--batch", "1"]
        + ["--seq", "32", "--steps", "3", "--metrics", str(metrics), "--quiet"]
        + ["--corpus-mb", "0.05", "--bpe-train-mb", "0.05", "--vocab", "300"]
        + ["--cache-dir", str(tmp_path / "cache"), "--tensorboard", str(board)]
        + ["--profile", str(traces)]
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = _summary(done.stdout.splitlines())
    assert summary.startswith("1x1x1 (dp x pp x tp) on 1 rank, cpu; model 1 x 768")
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[0]["peak_bytes"][0] > 0
    assert rows[0]["peak_bytes"][0] / rows[0]["planned_bytes"][0] == pytest.approx(
        1, abs=0.15
    )
    assert list(board.glob("events.out.tfevents.*"))  # TensorBoard's scalars
    assert list(traces.glob("rank0*.pt.trace.json"))  # torch.profiler's, steps 2-3
