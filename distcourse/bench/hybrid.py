"""`python -m distcourse.bench hybrid [--json] [--quick]`: every layout of 8 ranks.

One spawn of N ranks (8; 4 with --quick) trains the same TinyGPT under every
layout dp x pp x tp of N (8x1x1 pure data parallelism, ..., 1x1x8 pure tensor
parallelism), one after another in the same processes: a mesh per layout, a few
warm-up steps, then timed steps, each started together (a barrier) and lasting as
its slowest rank. Per layout: the median step time, and the bytes held by the
fullest rank (parameters, gradients, AdamW's moments: counted; activations kept
for backward: measured at the step's peak), with its activations apart. `ratio` is
the best layout's step time / pure data parallelism's: below 1, a hybrid wins here.
The TP layers skip their shape agreement (`check=False`), as production code does.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from distcourse import runtime, tables
from distcourse.bench import common
from distcourse.clock import DeviceTimer
from distcourse.examples.gpt import GPTConfig, TinyGPT, token_batches
from distcourse.launch import spawn
from distcourse.parallel import hybrid


@dataclass(frozen=True)
class Config:
    """Model sizes, the batch, how many steps, micro-batches per pipeline stage."""

    ranks: int
    n_layer: int
    n_head: int
    n_embd: int
    block_size: int
    batch: int
    warmup: int
    steps: int
    per_stage: int = 2  # micro-batches per pipeline stage
    only: tuple[str, ...] = ()  # these layouts ("2x2x2", ...); () is every one

    def gpt(self) -> GPTConfig:
        return GPTConfig(
            vocab=64,
            block_size=self.block_size,
            n_layer=self.n_layer,
            n_head=self.n_head,
            n_embd=self.n_embd,
        )


FULL = Config(
    ranks=8, n_layer=8, n_head=8, n_embd=64, block_size=32, batch=32, warmup=2, steps=8
)
QUICK = Config(
    ranks=4, n_layer=4, n_head=4, n_embd=16, block_size=8, batch=16, warmup=1, steps=2
)


def micro_batches(layout: hybrid.Layout, per_stage: int = 2) -> int:
    """`per_stage` per pipeline stage (2: 1F1B's bubble (p-1)/(m+p-1) under a
    third; 1: under a half, half the messages); 1 without a pipeline."""
    return per_stage * layout.pp if layout.pp > 1 else 1


def chosen(cfg: Config) -> list[hybrid.Layout]:
    """The layouts `cfg` measures, in `layouts` order: every one, or `cfg.only`;
    ValueError (before any message) for a name that is no layout of cfg.ranks."""
    every = hybrid.layouts(cfg.ranks)
    if unknown := set(cfg.only) - {lay.name for lay in every}:
        raise ValueError(
            f"no layout of {cfg.ranks} ranks is named {', '.join(sorted(unknown))}"
        )
    return [lay for lay in every if not cfg.only or lay.name in cfg.only]


def measure(cfg: Config) -> list[dict]:
    """On every rank of a world of cfg.ranks: one row per layout (the same rows on
    every rank): median step time, the fullest rank's bytes and its activations."""
    gpt, rows = cfg.gpt(), []
    batches = token_batches(cfg.warmup + cfg.steps, cfg.batch, gpt)
    for layout in chosen(cfg):
        mesh = hybrid.make_mesh(layout, gpt)
        torch.manual_seed(0)
        m = micro_batches(layout, cfg.per_stage)
        net = hybrid.HybridGPT(TinyGPT(gpt), mesh, micro_batches=m, check=False)
        times = torch.zeros(cfg.steps, dtype=torch.float64)
        timer = DeviceTimer()  # device time: a GPU runs the step after it is queued
        for i, (x, y) in enumerate(batches):
            dist.barrier()
            start = timer.stamp()
            net.step(x, y)
            if i >= cfg.warmup:
                times[i - cfg.warmup] = timer.seconds(start, timer.stamp())
        times = common.slowest(times)  # a step lasts as its slowest rank
        held = net.held()
        mine = torch.tensor(
            [sum(held.values()), held["activations"]], device=runtime.device()
        )
        every = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(every, mine)
        memory = max(every, key=lambda e: e[0].item())  # the fullest rank's
        net.close()
        rows.append(
            dict(
                layout=layout.name,
                dp=layout.dp,
                pp=layout.pp,
                tp=layout.tp,
                micro_batches=m,
                step_ms=round(1000 * statistics.median(times.tolist()), 3),
                memory_kib=round(memory[0].item() / 1024, 1),
                activations_kib=round(memory[1].item() / 1024, 1),
            )
        )
    return rows


def run(cfg: Config) -> dict:
    """The report: the table, the best layout, ratio = best / pure DP's step time."""
    if chosen(cfg)[0].dp != cfg.ranks:
        raise ValueError(f"the ratio needs pure data parallelism, {cfg.ranks}x1x1")
    rows = spawn(measure, cfg.ranks, cfg, timeout=120, deadline=600)[0]
    pure = next(r for r in rows if r["dp"] == cfg.ranks)
    best = min(rows, key=lambda r: r["step_ms"])
    return dict(
        benchmark="hybrid",
        ratio=round(best["step_ms"] / pure["step_ms"], 3),
        best=best["layout"],
        ranks=cfg.ranks,
        load=[round(v, 2) for v in os.getloadavg()],
        cpus=os.cpu_count(),
        config=asdict(cfg),
        table=rows,
    )


def format_table(rows: list[dict]) -> str:
    """The rows as an aligned text table; the step time last, so that a book can
    mask it ("T ms") without the columns moving."""
    cells = [
        (
            r["layout"],
            r["micro_batches"],
            f"{r['memory_kib']:.1f}",
            f"{r['activations_kib']:.1f}",
            f"{r['step_ms']:.1f} ms",
        )
        for r in rows
    ]
    return tables.aligned(
        [("dp x pp x tp", "m", "memory KiB", "activations", "step"), *cells],
        widths=(12, 3, 11, 11, 0),
        align=">>>>",
        gaps=(1, 1, 1, 2),
    )


def across_runs(results: list[dict]) -> list[str]:
    """Several `run` results of the same layouts as lines: each layout's step time in
    every run and their median, its memory; the fastest layout of each run; by median
    the fastest two and the slowest; the median step of the pure-TP-degree layouts
    (dp x 1 x tp) as tp doubles."""
    step: dict[str, list[float]] = {r["layout"]: [] for r in results[0]["table"]}
    for result in results:
        for r in result["table"]:
            step[r["layout"]].append(r["step_ms"])
    memory = {r["layout"]: r["memory_kib"] for r in results[0]["table"]}
    median = {name: statistics.median(times) for name, times in step.items()}
    runs = " ".join(f"{'run ' + str(i + 1):>8}" for i in range(len(results)))
    lines = [f"{'layout':>8} {runs} {'median':>8} {'KiB':>7}"]
    for name, times in step.items():
        cells = " ".join(f"{t:>5.0f} ms" for t in [*times, median[name]])
        lines.append(f"{name:>8} {cells} {memory[name]:>7,.0f}")
    order = sorted(median, key=median.get)
    ranks = results[0]["ranks"]
    tp_only = [f"{ranks // t}x1x{t}" for t in (1, 2, 4, 8) if t <= ranks]
    return [
        *lines,
        f"fastest in each run: {', '.join(r['best'] for r in results)}",
        f"by median: fastest {order[0]}, then {order[1]}; slowest {order[-1]}, "
        f"{median[order[-1]] / median[order[0]]:.1f} x the fastest",
        f"median step as tp doubles ({', '.join(tp_only)}): "
        + ", ".join(f"{median[n]:.0f} ms" for n in tp_only),
    ]


def main(argv: list[str]) -> int:
    """Parse options, run, print a table (or one JSON object)."""
    parser = common.parser(
        "hybrid",
        "Step time and memory per rank of every dp x pp x tp layout.",
        "4 ranks, tiny, 2 steps",
    )
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    result = run(cfg)
    return common.report(
        result,
        args.json,
        lambda: [
            f"load {result['load']} on {result['cpus']} CPUs; {cfg}",
            format_table(result["table"]),
            f"best {result['best']}: {result['ratio']:.2f} x pure data parallelism's "
            "step time",
        ],
    )
