"""`python -m distcourse.bench resnet [--json] [--repeats N] [--store]`: chapter 5's
step 0, PyTorch's model-parallel ResNet split over two ranks, naive and pipelined.

Runs `book/scripts/pipeline_resnet.py --small` under torchrun on 2 ranks of one
thread each (OMP_NUM_THREADS=1, CPU ranks), each row the median of `--repeats`
timed runs, each split cut where its two stages are balanced by measurement (the
script's docstring). The chapter's claim is judged on those medians: the fastest
pipelined split at least SPEEDUP times faster than the naive split (the whole batch
through the two stages, one rank idle while the other works), and than its own
micro-batches with the stages taking turns (their measured compute added up): the
second speed-up is the overlap alone.

The two stages overlap only while each rank has a core: on 2 cores, 2 ranks and
nothing else. `--store` measures that and writes book/measurements/ch05_split.json
with its provenance (bench.record), refusing a busy machine; the chapter runs the
same script live (one timed run a row) and prints it beside the stored one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from distcourse.bench import record
from distcourse.launch.script import swapped

NAME = "ch05_split"
SPEEDUP = 1.2  # the least speed-up of the best pipelined split over the naive one
SCRIPT = Path(__file__).resolve().parents[2] / "book" / "scripts" / "pipeline_resnet.py"


def run(
    repeats: int = 1,
    cut: str = "balanced",
    timeout: float = 600,
    swap: tuple[str, str] | None = None,
    splits: tuple[int, ...] = (),
) -> dict:
    """The script's JSON record: one process, then per row (split size, m, median
    seconds, each stage's compute ms per micro-batch, the cut). `swap` replaces one
    line of the script (`launch.script.swapped`: a negative control's fault);
    `splits`, the split sizes to run (default: the script's sweep)."""
    with tempfile.TemporaryDirectory(prefix="distcourse-resnet-") as tmp:
        script = SCRIPT
        if swap is not None:
            script = Path(tmp) / SCRIPT.name
            script.write_text(swapped(SCRIPT.read_text(), swap))
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2"]
        command += [str(script), "--small", "--json", f"--repeats={repeats}"]
        command += ["--splits", *map(str, splits)] if splits else []
        env = {**os.environ, "OMP_NUM_THREADS": "1", "DISTCOURSE_DEVICE": "cpu"}
        done = subprocess.run(
            [*command, f"--cut={cut}"],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
    if done.returncode:
        raise RuntimeError(f"{SCRIPT.name} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.splitlines()[-1])  # the script's last line


def speedups(data: dict[str, Any]) -> list[tuple[int, int, float]]:
    """(split size, m, naive seconds / its seconds) of each pipelined row."""
    naive = data["rows"][0][2]
    return [(row[0], row[1], naive / row[2]) for row in data["rows"][1:]]


def best(data: dict[str, Any]) -> tuple[int, int, float]:
    """The pipelined row with the largest speed-up over naive."""
    return max(speedups(data), key=lambda row: row[2])


def imbalance(row: list) -> float:
    """The slower stage's compute per micro-batch over the faster one's (1: even)."""
    slow, fast = max(row[3]), min(row[3])
    return slow / fast if fast > 0 else float("inf")


def in_turns(data: dict[str, Any], row: list) -> float:
    """Seconds `row`'s split would take with its two stages taking turns: each of
    the run's batches, each of its m micro-batches through stage 0's compute and
    then stage 1's (the row's own compute per micro-batch, measured in this run)."""
    return data["batches"] * row[1] * sum(row[3]) / 1000


def verdict(stored: record.Stored) -> str:
    """The chapter's line: the best split's speed-up against SPEEDUP, twice: over
    the naive split, and over its own micro-batches with the stages taking turns
    (smaller micro-batches that are merely cheaper per image pass the first, never
    the second); on a run stored on a quiet machine (a busy one fails whatever it
    measured)."""
    split, m, speedup = best(stored.data)
    row = next(r for r in stored.data["rows"][1:] if r[0] == split)
    gain = in_turns(stored.data, row) / row[2]
    ok = min(speedup, gain) >= SPEEDUP and stored.provenance.get("quiet")
    return (
        f"best pipelined split {split} ({m} micro-batches): {speedup:.2f}x the naive "
        f"split and {gain:.2f}x its stages taking turns, both at least {SPEEDUP}x: "
        f"{'PASS' if ok else 'FAIL'}"
    )


def table(stored: dict[str, Any], live: dict[str, Any] | None = None) -> list[str]:
    """Per row: the cut, each stage's ms per micro-batch and the speed-up of the
    stored run; the live run's speed-up after '(live)' (the book masks it)."""
    ups = {split: s for split, _, s in speedups(stored)}
    here = {split: s for split, _, s in speedups(live)} if live else {}
    lines = ["split   m  cut  stage 0 ms  stage 1 ms  slower/faster  vs naive"]
    for row in stored["rows"]:
        split, m, _, (ms0, ms1), cut = row
        line = (
            f"{split:>5} {m:>3} {cut:>4} {ms0:>11.1f} {ms1:>11.1f} "
            f"{imbalance(row):>14.2f} {ups.get(split, 1.0):>8.2f}x"
        )
        if split in here:
            line += f"  (live) {here[split]:.2f}x"
        lines.append(line)
    return lines


def report(stored: record.Stored | None, live: dict[str, Any] | None = None) -> None:
    """Print the stored run's table, provenance and verdict (or that none is
    stored), with the live run's speed-ups beside."""
    here = [
        f"split {split:>2} ({m:>2} micro-batches): (live) {s:.2f}x"
        for split, m, s in (speedups(live) if live and stored is None else [])
    ]
    record.report(
        NAME, "resnet", stored, lambda d: table(d, live), lambda s: [verdict(s)], here
    )


def main(argv: list[str]) -> int:
    parser = record.parser("resnet", NAME)
    parser.add_argument("--repeats", type=int, default=5, help="timed runs a row")
    parser.add_argument("--cut", choices=("balanced", "layer2"), default="balanced")
    args = parser.parse_args(argv)
    with record.Quiet() as quiet:
        data = run(args.repeats, args.cut, timeout=60 * (10 + args.repeats))
    return record.finish(NAME, data, quiet, report, args, ranks=2, threads_per_rank=1)
