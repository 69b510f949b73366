"""`python -m distcourse.bench scaling [--quick]`: what data parallelism costs in time.

torch's DDP trains `wide_mlp` on 1, 2 and 4 ranks, two ways. Strong scaling keeps
the global batch fixed (each of N ranks gets 1/N of it): the ideal step time falls
as 1/N. Weak scaling keeps the per-rank batch fixed (the global batch grows with N):
the ideal step time stays flat, so throughput grows N-fold. The all-reduce, and on
a machine with fewer cores than ranks the sharing of cores, keep both from ideal.
Every step time is the slowest rank's (a step ends when the last rank is done).

What keeps strong scaling from ideal is split in two, in the same rounds: the step
under `no_sync()` (no gradient communication at all: what does not shrink with the
batch, as the optimizer step over every parameter and each weight read in forward
and backward) and the all-reduce of the gradients' bytes alone (`dist.all_reduce`
of one flat tensor of 4P bytes), each a median of the slowest rank's times.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from distcourse import runtime, tables
from distcourse.bench import common, record
from distcourse.clock import DeviceTimer
from distcourse.examples import models
from distcourse.launch import spawn

NAME = "ch03b_scaling"  # the stored run chapter 3b prints (bench.record)
MODES = ("strong", "weak")
PARTS = {"no_sync_ms": "no communication", "all_reduce_ms": "all-reduce alone"}


@dataclass(frozen=True)
class Config:
    """Model, batches and how many steps to time."""

    width: int = 512
    depth: int = 4
    d_in: int = 256
    global_batch: int = 128  # strong scaling: split over the ranks
    per_rank: int = 32  # weak scaling: every rank's batch
    warmup: int = 3
    steps: int = 15
    worlds: tuple[int, ...] = (1, 2, 4)
    rounds: int = 2  # every world size this often, in turn; its faster round is kept


QUICK = Config(
    width=32, depth=2, d_in=16, global_batch=8, per_rank=2, steps=2, rounds=1
)


def _measure(cfg: Config) -> dict[str, list[float]]:
    """On every rank: the slowest rank's step times (s) in each mode."""
    world = runtime.require_initialized().world_size
    runtime.seed_everything(0, per_rank=False)
    device = runtime.device()  # the rank's own: a GPU on a GPU box
    model = models.wide_mlp(cfg.width, cfg.depth, cfg.d_in).to(device)
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    times = {}
    grads = torch.zeros(models.count_parameters(model), device=device)
    steps = {
        "no communication": lambda x, y: _step(ddp, optimizer, x, y, sync=False),
        "all-reduce alone": lambda x, y: dist.all_reduce(grads),
    }
    for mode in MODES:
        batch = cfg.global_batch // world if mode == "strong" else cfg.per_rank
        x = torch.randn(batch, cfg.d_in).to(device)
        y = torch.randint(0, 10, (batch,)).to(device)
        spent = torch.zeros(cfg.steps, dtype=torch.float64)
        timer = DeviceTimer()  # device time: a GPU runs the step after it is queued
        for i in range(cfg.warmup + cfg.steps):
            dist.barrier()
            start = timer.stamp()
            optimizer.zero_grad()
            F.cross_entropy(ddp(x), y).backward()
            optimizer.step()
            if i >= cfg.warmup:
                spent[i - cfg.warmup] = timer.seconds(start, timer.stamp())
        times[mode] = common.slowest(spent).tolist()
        if mode == "strong":  # the gap's two parts, on the same batch
            for part, step in steps.items():
                times[part] = _timed(lambda: step(x, y), cfg)  # noqa: B023
    return times


def _step(ddp: DistributedDataParallel, optimizer, x, y, sync: bool) -> None:  # noqa: ANN001
    """One training step; without `sync` under no_sync(): no gradient all-reduce."""
    optimizer.zero_grad()
    if sync:
        F.cross_entropy(ddp(x), y).backward()
    else:
        with ddp.no_sync():
            F.cross_entropy(ddp(x), y).backward()
    optimizer.step()


def _timed(step, cfg: Config) -> list[float]:  # noqa: ANN001
    """The slowest rank's seconds of `step()`, cfg.steps times after the warm-up."""
    spent = torch.zeros(cfg.steps, dtype=torch.float64)
    timer = DeviceTimer()
    for i in range(cfg.warmup + cfg.steps):
        dist.barrier()
        start = timer.stamp()
        step()
        if i >= cfg.warmup:
            spent[i - cfg.warmup] = timer.seconds(start, timer.stamp())
    return common.slowest(spent).tolist()


def summarize(times: dict[int, dict[str, list[float]]], cfg: Config) -> list[dict]:
    """One row per (mode, ranks): batches, step time quartiles (ms), speed-up.

    Speed-up is throughput (samples per second) relative to one rank: strong
    t1 / tN (the same samples), weak N * t1 / tN (N times the samples).
    """
    rows = []
    for mode in MODES:
        base = statistics.median(times[1][mode]) if 1 in times else None
        for world, by_mode in sorted(times.items()):
            q1, median, q3 = statistics.quantiles(
                by_mode[mode], n=4, method="inclusive"
            )
            per_rank = cfg.global_batch // world if mode == "strong" else cfg.per_rank
            speedup = None
            if base is not None:
                samples = 1 if mode == "strong" else world
                speedup = samples * base / median
            parts = {
                key: 1000 * statistics.median(by_mode[part])
                for key, part in PARTS.items()
                if mode == "strong" and part in by_mode
            }
            rows.append(
                dict(
                    mode=mode,
                    ranks=world,
                    per_rank=per_rank,
                    global_batch=per_rank * world,
                    q1_ms=1000 * q1,
                    median_ms=1000 * median,
                    q3_ms=1000 * q3,
                    speedup=speedup,
                    **parts,
                )
            )
    return rows


def run(cfg: Config) -> list[dict]:
    """Measure every world size (one spawn each), in `cfg.rounds` rounds; summarize.

    World sizes run one after another, so on a shared machine a burst of other
    load can slow one of them only: a one-rank baseline measured in such a burst
    makes two ranks look faster than ideal. Load only adds time, so each world
    size, measured once per round, keeps the round whose median step is lower.
    """
    times: dict[int, dict[str, list[float]]] = {}
    for _ in range(cfg.rounds):
        for w in cfg.worlds:
            got = spawn(_measure, w, cfg, deadline=300)[0]
            if w not in times or _median_sum(got) < _median_sum(times[w]):
                times[w] = got
    return summarize(times, cfg)


def _median_sum(by_mode: dict[str, list[float]]) -> float:
    """One round's summary, for choosing between rounds: the sum of mode medians."""
    return sum(statistics.median(by_mode[mode]) for mode in MODES)


def gap(rows: list[dict], world: int = 2) -> dict[str, float]:
    """Strong scaling on `world` ranks against ideal (one rank's step / world), in
    ms: the gap, the part without communication (the no_sync step over ideal),
    the part communication adds (the step over the no_sync step) and the
    all-reduce of the gradients alone."""
    strong = {r["ranks"]: r for r in rows if r["mode"] == "strong"}
    mine, ideal = strong[world], strong[1]["median_ms"] / world
    return dict(
        step=mine["median_ms"],
        ideal=ideal,
        gap=mine["median_ms"] - ideal,
        without_communication=mine["no_sync_ms"] - ideal,
        communication=mine["median_ms"] - mine["no_sync_ms"],
        all_reduce_alone=mine["all_reduce_ms"],
    )


def format_table(rows: list[dict], speedup: bool = True) -> str:
    """The rows as aligned text. Every time carries its unit, so the book's nbval
    rules mask it; `speedup=False` leaves out the one column they would not mask."""
    lines = [("mode", "ranks", "batch/rank", "global", "step: median [quartiles]")]
    for r in rows:
        step = f"{r['median_ms']:.2f} ms [{r['q1_ms']:.2f} ms, {r['q3_ms']:.2f} ms]"
        if speedup and r["speedup"] is not None:
            step += f"  speed-up {r['speedup']:.2f}x"
        lines.append((r["mode"], r["ranks"], r["per_rank"], r["global_batch"], step))
    return tables.aligned(
        lines, widths=(7, 5, 10, 6, 0), align="<>>>", gaps=(1, 2, 2, 2)
    )


def gap_line(g: dict[str, float]) -> str:
    """`gap`'s numbers as one line (every number in ms, which the book masks)."""
    return (
        f"{g['step']:.2f} ms a step against an ideal {g['ideal']:.2f} ms: "
        f"{g['gap']:.2f} ms more, {g['without_communication']:.2f} ms of it with no "
        f"communication at all (no_sync), {g['communication']:.2f} ms what "
        f"communication adds (the gradients' all-reduce alone: "
        f"{g['all_reduce_alone']:.2f} ms)"
    )


def main(argv: list[str]) -> int:
    cfg, args, rows, quiet = record.measured(
        "scaling", NAME, argv, "tiny model, few steps", (QUICK, Config()), run
    )

    def show(_: record.Stored) -> None:
        print(format_table(rows))
        print(f"strong, 2 ranks: {gap_line(gap(rows))}")

    runs = dict(ranks=list(cfg.worlds), threads_per_rank=1)
    return record.finish(NAME, dict(rows=rows), quiet, show, args, **runs)


def plot(rows: list[dict]) -> object:
    """Step time against ranks per mode: medians, quartile bars, the ideal line, in
    the book's figure style (no text under viz.common.SMALL points; 9 inches wide:
    the book shows it with viz.figure(..., wide=True))."""
    import matplotlib.pyplot as plt

    from distcourse.viz.common import SMALL, STYLE

    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
        for ax, mode in zip(axes, MODES, strict=True):
            mine = [r for r in rows if r["mode"] == mode]
            ranks = [r["ranks"] for r in mine]
            median = [r["median_ms"] for r in mine]
            spread = [
                [r["median_ms"] - r["q1_ms"] for r in mine],
                [r["q3_ms"] - r["median_ms"] for r in mine],
            ]
            ax.errorbar(
                ranks,
                median,
                yerr=spread,
                marker="o",
                capsize=4,
                label="measured: median, quartiles",
            )
            ideal = [median[0] / n if mode == "strong" else median[0] for n in ranks]
            ax.plot(ranks, ideal, "--", color="grey", label="ideal (no communication)")
            batch = "global" if mode == "strong" else "per-rank"
            ax.set(
                xticks=ranks, xlabel="ranks", ylabel="step time (ms)", ylim=(0, None)
            )
            ax.set_title(f"{mode} scaling: fixed {batch} batch")
            ax.legend(fontsize=SMALL)
        fig.tight_layout()
    plt.close(fig)  # the caller displays it; pyplot must not show it a second time
    return fig
