"""`python -m distcourse.bench plan [--json] [--quick]`: the planner's step time
against a measured one, on this machine.

One spawn of N ranks (4) fits chapter 2's alpha-beta model to all-reduces of 4 KiB
to 1 MiB (`comm.costmodel.measure`, `fit_collective` for the ring) and times a
matmul on one thread (`plan.matmul_rate`): that is this machine as a
`plan.Hardware` (`plan.local`). Then `bench.hybrid.measure` trains TinyGPT under a
few layouts and times their steps; `plan.predict` predicts each from the fitted
hardware. `factor` is the worst ratio either way, predicted / measured; the
prediction leaves out what a step does beyond matmuls and messages (norms, GELU,
softmax, the optimizer, Python, the pipeline's threads), so it runs fast: measured
on 2 busy cores (load 3-4), 4 ranks, width 256, 128 tokens, measured steps took
2-3.3 x the prediction (factor 3.25); at width 32 (--quick), where matmuls are a
small part of a step, up to 12.7 x.
"""

from __future__ import annotations

import dataclasses
import os

import psutil
import torch
import torch.distributed as dist

from distcourse import plan, runtime, tables
from distcourse.bench import common
from distcourse.bench import hybrid as hybrid_bench
from distcourse.comm import costmodel
from distcourse.launch import spawn

SIZES = [2**12, 2**14, 2**16, 2**18, 2**20]  # bytes all-reduced in the fit
LAYOUTS = ("4x1x1", "2x2x1", "2x1x2", "1x1x4")
FULL = hybrid_bench.Config(4, 4, 4, 256, 128, 16, 2, 6, per_stage=1, only=LAYOUTS)
QUICK = dataclasses.replace(FULL, n_embd=32, block_size=16, warmup=1, steps=2)


def fit(ranks: int) -> dict[str, float]:
    """On every rank: alpha and beta of the ring all-reduce, a one-thread matmul
    rate and a copy's bytes a second (the slowest rank's), as a plan.Hardware's
    fields."""
    torch.set_num_threads(1)
    times = costmodel.measure(dist.all_reduce, SIZES, repeats=5)
    alpha, beta = costmodel.fit_collective("ring_all_reduce", SIZES, times, ranks)
    device = runtime.device()
    rates = [plan.matmul_rate(256, device=device), plan.copy_rate(device=device)]
    rate = torch.tensor(rates, dtype=torch.float64, device=device)
    dist.all_reduce(rate, op=dist.ReduceOp.MIN)
    flops, bandwidth = rate.tolist()
    return dict(
        alpha=max(alpha, 0.0), beta=max(beta, 0.0), flops=flops, bandwidth=bandwidth
    )


def predicted(cfg: hybrid_bench.Config, row: dict, hw: plan.Hardware) -> float:
    """Predicted seconds of a step of one measured row."""
    layout = plan.PlanLayout(row["dp"], row["tp"], row["pp"], row["micro_batches"])
    model = plan.ModelSpec.from_config(cfg.gpt())
    found = plan.predict(model, cfg.batch, plan.DTypePolicy("fp32"), layout, hw)
    return found.time["total"]


def run(cfg: hybrid_bench.Config) -> dict:
    """Fit, measure, predict: the table and the worst factor."""
    fitted = spawn(fit, cfg.ranks, cfg.ranks, timeout=60)[0]
    memory = psutil.virtual_memory().total // cfg.ranks
    hw = plan.local(
        fitted["alpha"],
        fitted["beta"],
        fitted["flops"],
        memory,
        cfg.ranks,
        bandwidth=fitted["bandwidth"],
    )
    rows = spawn(hybrid_bench.measure, cfg.ranks, cfg, timeout=120, deadline=600)[0]
    table = []
    for row in rows:
        guess = predicted(cfg, row, hw)
        table.append(
            dict(
                layout=row["layout"],
                measured_ms=row["step_ms"],
                predicted_ms=round(1000 * guess, 3),
                ratio=round(1000 * guess / row["step_ms"], 3),
            )
        )
    factor = max(max(r["ratio"], 1 / r["ratio"]) for r in table)
    return dict(
        benchmark="plan",
        factor=round(factor, 2),
        hardware=hw.to_dict(),
        ranks=cfg.ranks,
        load=[round(v, 2) for v in os.getloadavg()],
        config=dataclasses.asdict(cfg),
        table=table,
    )


def text(result: dict) -> list[str]:
    hw = result["hardware"]
    cells = [
        (r["layout"], f"{r['predicted_ms']:.1f} ms", f"{r['measured_ms']:.1f} ms")
        + (f"{r['ratio']:.2f}",)
        for r in result["table"]
    ]
    return [
        f"fitted: alpha {hw['alpha_node'] * 1e6:.0f} us, "
        f"{1 / hw['beta_node'] / 1e9 if hw['beta_node'] else float('inf'):.2f} GB/s, "
        f"matmul {hw['flops_fp32'] / 1e9:.1f} GFLOP/s per rank",
        tables.aligned(
            [("dp x pp x tp", "predicted", "measured", "ratio"), *cells], align=">>>>"
        ),
        f"worst factor, either way: {result['factor']}",
    ]


def main(argv: list[str]) -> int:
    parser = common.parser(
        "plan", "Predicted against measured step times.", "tiny model, 2 steps"
    )
    args = parser.parse_args(argv)
    result = run(QUICK if args.quick else FULL)
    return common.report(result, args.json, lambda: text(result))
