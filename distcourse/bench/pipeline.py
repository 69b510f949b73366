"""`python -m distcourse.bench pipeline [--json] [--quick] [--sleep]`: pipelines, timed.

Three measurements, each a median over steps of the slowest rank's time:

- speedup: on 2 ranks, the same batch through a 2-stage split run naively (one
  micro-batch: one rank idles while the other works) and pipelined by 1F1B with m
  micro-batches for each m of a sweep; the best m's speed-up over naive;
- efficiency, for each m: ideal over measured step time, the median of the
  rounds' own ratios, where ideal_ms is the step on paper of a pipeline of the
  same stages (pp.ideal_step: each stage's forward and backward timed alone on
  this m's micro-batch, both ranks at once, in the same rounds; transfers free).
  It is what our runner loses (transfers, waits, checks, Python), not what
  a small micro-batch loses in compute: that shows as per_micro_batch_ms (the
  compute an extra micro-batch adds to a stage: at width 1024 each micro-batch
  reads every weight again and writes its gradient, whatever its size) and in
  of_limit, the speed-up over the limit 2m / (m + 1) of equal, free micro-batches;
- bubble_error: on 4 ranks, 1F1B's idle share measured from its events, against
  (p - 1) / (m + p - 1);
- ratio: on the same 4 ranks and stages, our 1F1B step time over torch's
  Schedule1F1B, run in alternate rounds so that load drifts hit both alike: the
  median of the rounds' ratios, with their quartiles (steps4 rounds). Ours agrees
  on the batch's shape every step (a small all-gather that turns a bad batch into
  the same error on every rank), overlapped with the first stage's first forward;
  inputs_once_ratio is the same with Pipeline(inputs="first"), which agrees once,
  as torch's stages infer shapes once;
- schedules: in the same rounds, our GPipe and ZB-H1 too; each one's bubble and
  formula ((p - 1) / (m + p - 1); ZB-H1's (p - 1) / (3m + p - 1) holds for equal F,
  B and W times, as with --sleep) and step time; zb_ratio is our ZB-H1 over torch's
  ScheduleInterleavedZeroBubble on the same 4 stages (one per rank), which torch
  runs as its zero-bubble schedule for that case;
- plain_ratio: in the same rounds, the plain runner (pipeline/plain.py: blocking
  receives, shapes found on every rank each step) over our 1F1B: what the fast
  path's posted receives, shapes agreed once and overlapped batch check buy.

Stages are Linear+ReLU blocks; with --sleep each block instead sleeps (forward t per
sample, backward 2t: t for the input's gradient, t for the weight's, so ZB-H1's B
and W each take t), so the numbers measure the schedules and our transfers, not how
a loaded CPU shares its cores among ranks. The defaults (t = 1 ms per sample at
--sleep 0.001, m = 8 on 4 ranks) make a stage's work large beside one transfer, so
the bubble's excess over the formula shows mostly how long the machine takes to
wake a waiting rank; the report prints the times this machine measured.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from distcourse import runtime, tables
from distcourse.bench import common
from distcourse.clock import DeviceTimer
from distcourse.launch import spawn
from distcourse.parallel import pipeline as pp
from distcourse.parallel.pipeline.plain import PlainPipeline
from distcourse.parallel.pipeline.torch_side import TorchPipeline


@dataclass(frozen=True)
class Config:
    width: int
    blocks: int  # Linear+ReLU blocks, split evenly over the stages
    batch: int
    sweep: tuple[int, ...]  # micro-batch counts for the 2-stage speed-up
    m4: int  # micro-batches on 4 ranks
    warmup: int
    steps: int  # timed steps on 2 ranks
    steps4: int  # timed steps on 4 ranks: the ratio is a median of this many
    sleep_per_sample: float = 0.0  # seconds; > 0 replaces compute by sleeping


FULL = Config(
    width=1024,
    blocks=8,
    batch=128,
    sweep=(2, 4, 8, 16),
    m4=8,
    warmup=2,
    steps=10,
    steps4=24,
)
QUICK = Config(
    width=32, blocks=4, batch=8, sweep=(2, 4), m4=4, warmup=1, steps=2, steps4=2
)


class Sleep(torch.autograd.Function):
    """Identity that sleeps `seconds` forward and `back` seconds backward."""

    @staticmethod
    def forward(ctx, x: Tensor, seconds: float, back: float) -> Tensor:  # noqa: ANN001
        ctx.back = back
        if seconds:  # not even sleep(0): under load it can lose the core
            time.sleep(seconds)
        return x.clone()

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:  # noqa: ANN001
        if ctx.back:
            time.sleep(ctx.back)
        return grad, None, None


class Block(nn.Module):
    """Linear + ReLU, or (sleep_per_sample > 0) a timed sleep with a scale."""

    def __init__(self, width: int, sleep_per_sample: float) -> None:
        super().__init__()
        self.t = sleep_per_sample
        self.linear = nn.Linear(width, width) if not self.t else None
        self.scale = nn.Parameter(torch.ones(width)) if self.t else None

    def forward(self, x: Tensor) -> Tensor:
        if self.t:  # the backward's t per sample for the input, t for the scale
            t = self.t * len(x)
            return Sleep.apply(x * Sleep.apply(self.scale, 0.0, t), t, t)
        return F.relu(self.linear(x))


def _model(cfg: Config) -> nn.Sequential:
    torch.manual_seed(0)
    blocks = [Block(cfg.width, cfg.sleep_per_sample) for _ in range(cfg.blocks)]
    return nn.Sequential(*blocks).to(runtime.device())  # the rank's own device


def _data(cfg: Config) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(cfg.batch, cfg.width, generator=gen)
    y = torch.randn(cfg.batch, cfg.width, generator=gen)
    return x.to(runtime.device()), y.to(runtime.device())


def _timed(runners: list, cfg: Config, steps: int) -> torch.Tensor:
    """[runner, step] seconds of the slowest rank; runners take turns each round."""
    x, y = _data(cfg)
    times = torch.zeros(len(runners), steps, dtype=torch.float64)
    timer = DeviceTimer()  # device time: a GPU runs the step after it is queued
    for i in range(cfg.warmup + steps):
        order = range(len(runners)) if i % 2 == 0 else reversed(range(len(runners)))
        for k in order:
            dist.barrier()
            start = timer.stamp()
            runners[k].step(x, y)
            if i >= cfg.warmup:
                times[k, i - cfg.warmup] = timer.seconds(start, timer.stamp())
    return common.slowest(times)


def _ours(cfg: Config, schedule: pp.Schedule, **options: str) -> pp.Pipeline:
    """Our runner on a fresh copy of the model, split for `schedule`."""
    stages = pp.split_by_count(_model(cfg), schedule.stages)
    return pp.Pipeline(stages, schedule, F.mse_loss, timeout=60, **options)


def _two_ranks(cfg: Config) -> dict:
    """Step times: naive (m = 1) first, then 1F1B for each m of the sweep; and in
    the same rounds each rank's stage alone on a micro-batch of each size:
    alone[m][round][rank] = (forward, backward) seconds."""
    ms = (1, *cfg.sweep)
    pipes = [_ours(cfg, pp.one_f_one_b(2, m)) for m in ms]
    rank, (x, _) = dist.get_rank(), _data(cfg)
    first, stage = pp.split_by_count(_model(cfg), 2)  # a copy, as the pipes' are
    with torch.no_grad():  # stage 1's input is stage 0's output
        x = x if rank == 0 else first(x)
    alone = [
        pp.StageTimer(first if rank == 0 else stage, x[: cfg.batch // m]) for m in ms
    ]
    times = _timed([*pipes, *alone], cfg, cfg.steps)[: len(ms)]
    for pipe in pipes:
        pipe.close()
    mine = [a.times[cfg.warmup :] for a in alone]
    seen: list = [None] * dist.get_world_size()
    dist.all_gather_object(seen, mine)
    rounds = [list(zip(*at_m, strict=True)) for at_m in zip(*seen, strict=True)]
    return dict(times=times.tolist(), alone=rounds)


SCHEDULES = {"1F1B": pp.one_f_one_b, "GPipe": pp.gpipe, "ZB-H1": pp.zb_h1}


def _four_ranks(cfg: Config) -> dict:
    """Our 1F1B and torch's, our GPipe and ZB-H1, taking turns; our events give
    each schedule's bubble."""
    ours = {name: _ours(cfg, make(4, cfg.m4)) for name, make in SCHEDULES.items()}
    # inputs agreed on the first step only, as torch's stages do
    ours["1F1B once"] = _ours(cfg, pp.one_f_one_b(4, cfg.m4), inputs="first")
    theirs = TorchPipeline(
        pp.split_by_count(_model(cfg), 4), "1F1B", cfg.m4, F.mse_loss
    )
    theirs_zb = TorchPipeline(
        pp.split_by_count(_model(cfg), 4), "interleaved zero bubble", cfg.m4, F.mse_loss
    )
    steps: dict[str, list] = {name: [] for name in ours}

    class Recorder:  # one of our pipelines, keeping each step's events
        def __init__(self, name: str) -> None:
            self.name = name

        def step(self, x: Tensor, y: Tensor) -> None:
            pipe = ours[self.name]
            pipe.step(x, y)
            steps[self.name].append([(e.name, e.start, e.end) for e in pipe.events])

    plain = PlainPipeline(
        pp.split_by_count(_model(cfg), 4), pp.one_f_one_b(4, cfg.m4), F.mse_loss
    )
    runners = [
        Recorder("1F1B"),
        theirs,
        Recorder("GPipe"),
        Recorder("ZB-H1"),
        Recorder("1F1B once"),
        theirs_zb,
        plain,
    ]
    times = _timed(runners, cfg, cfg.steps4)
    for pipe in ours.values():
        pipe.close()
    seen: list = [None] * dist.get_world_size()
    dist.all_gather_object(seen, steps)  # after the timing: [rank][name][step]
    bubbles = {
        name: [
            pp.bubble([rank[name][i] for rank in seen])
            for i in range(cfg.warmup, len(steps[name]))
        ]
        for name in ours
    }
    return dict(times=times.tolist(), bubbles=bubbles)


def _median(values: list[float]) -> float:
    return torch.tensor(values, dtype=torch.float64).median().item()


def run(cfg: Config, four_ranks: bool = True) -> dict:
    """The report: speed-up, efficiency, a table; then (four_ranks) bubble error,
    ratios against torch and the plain runner, each schedule's bubble."""
    two = spawn(_two_ranks, 2, cfg, timeout=60, deadline=600)[0]
    step = [_median(t) for t in two["times"]]
    ms = (1, *cfg.sweep)
    speedups = [step[0] / s for s in step]
    ideal, efficiency = zip(  # per m: the same stages alone, transfers free
        *(
            pp.efficiency(pp.one_f_one_b(2, mm), rounds, times)
            for mm, rounds, times in zip(ms, two["alone"], two["times"], strict=True)
        ),
        strict=True,
    )
    best = max(range(1, len(ms)), key=lambda i: speedups[i])
    m = ms[best]
    table = [
        dict(
            m=mm,
            step_ms=round(1000 * s, 3),
            speedup=round(speedup, 3),
            limit=round(2 * mm / (mm + 1), 3),
            ideal_ms=round(1000 * best_case, 3),
            efficiency=round(eff, 3),
        )
        for mm, s, speedup, best_case, eff in zip(
            ms, step, speedups, ideal, efficiency, strict=True
        )
    ]
    report = dict(
        benchmark="pipeline",
        speedup=round(speedups[best], 3),
        m=m,
        efficiency=table[best]["efficiency"],  # ideal / measured, at the best m
        ideal_ms=table[best]["ideal_ms"],
        of_limit=round(speedups[best] / (2 * m / (m + 1)), 3),
        per_micro_batch_ms=round(1000 * pp.extra_per_micro_batch(ms, two["alone"]), 3),
        load=[round(v, 2) for v in os.getloadavg()],
        cpus=os.cpu_count(),
        config=asdict(cfg),
        table=table,
    )
    return {**report, **_four(cfg)} if four_ranks else report


def _four(cfg: Config) -> dict:
    """On 4 ranks: 1F1B's bubble against the formula, ours against torch's and the
    plain runner, each schedule's bubble and step time."""
    four = spawn(_four_ranks, 4, cfg, timeout=60, deadline=600)[0]
    t4 = torch.tensor(four["times"])  # 1F1B, torch's, GPipe, ZB-H1, 1F1B once,
    # torch's ZB, plain 1F1B
    ratios = (t4[0] / t4[1]).sort().values  # each round's own ratio
    ratio = _median(ratios.tolist())
    quartiles = [ratios[len(ratios) // 4].item(), ratios[3 * len(ratios) // 4].item()]
    once_ratio = _median((t4[4] / t4[1]).tolist())
    zb_ratio = _median((t4[3] / t4[5]).tolist())
    plain_ratio = _median((t4[6] / t4[0]).tolist())
    measured = _median(four["bubbles"]["1F1B"])
    formula = pp.bubble_formula(4, cfg.m4)
    formulas = {"1F1B": formula, "GPipe": formula, "ZB-H1": pp.zb_h1_bubble(4, cfg.m4)}
    schedules = {}
    for row, name in ((0, "1F1B"), (2, "GPipe"), (3, "ZB-H1")):
        bubble, took = _median(four["bubbles"][name]), _median(t4[row].tolist())
        schedules[name] = dict(
            bubble=round(bubble, 4),
            step_ms=round(1000 * took, 3),
            formula=round(formulas[name], 4),
        )
    return dict(
        bubble_error=round(measured / formula - 1, 3),
        bubble_measured=round(measured, 4),
        bubble_formula=round(formula, 4),
        ratio=round(ratio, 3),
        ratio_quartiles=[round(q, 3) for q in quartiles],
        inputs_once_ratio=round(once_ratio, 3),
        zb_ratio=round(zb_ratio, 3),
        torch_zb_ms=round(1000 * _median(t4[5].tolist()), 3),
        ours_ms=round(1000 * _median(t4[0].tolist()), 3),
        torch_ms=round(1000 * _median(t4[1].tolist()), 3),
        plain_ratio=round(plain_ratio, 3),
        plain_ms=round(1000 * _median(t4[6].tolist()), 3),
        schedules=schedules,
    )


def format_table(rows: list[dict]) -> str:
    """The sweep over micro-batch counts m: step time, speed-up over naive and its
    limit 2m / (m + 1), the ideal step of the same stages and measured efficiency."""
    cells = [
        (
            r["m"],
            f"{r['step_ms']:.2f}",
            f"{r['speedup']:.2f}",
            f"{r['limit']:.2f}",
            f"{r['ideal_ms']:.2f}",
            f"{r['efficiency']:.2f}",
        )
        for r in rows
    ]
    return tables.aligned(
        [("m", "step ms", "speed-up", "limit", "ideal ms", "efficiency"), *cells],
        widths=(4, 9, 9, 6, 9, 10),
        align=">>>>>>",
    )


def main(argv: list[str]) -> int:
    """Parse options, run, print a summary (or one JSON object)."""
    parser = common.parser(
        "pipeline",
        "Pipeline speed-up, bubble and step time against torch's.",
        "tiny model, few steps",
    )
    parser.add_argument(
        "--sleep",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="stages sleep this long per sample instead of computing",
    )
    parser.add_argument(
        "--two",
        action="store_true",
        help="only the 2-rank sweep (speed-up, efficiency)",
    )
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    if args.sleep:
        cfg = Config(
            **{**asdict(cfg), "sleep_per_sample": args.sleep, "sweep": tuple(cfg.sweep)}
        )
    r = run(cfg, four_ranks=not args.two)
    return common.report(
        r,
        args.json,
        lambda: [
            f"load {r['load']} on {r['cpus']} CPUs; {cfg}",
            format_table(r["table"]),
            f"best m={r['m']}: efficiency {r['efficiency']:.2f} (ideal "
            f"{r['ideal_ms']:.1f} ms of the same stages / measured); speed-up "
            f"{r['of_limit']:.2f} of 2m / (m + 1); each extra micro-batch costs a "
            f"stage {r['per_micro_batch_ms']:.1f} ms of compute",
            *([] if args.two else _four_lines(r)),
        ],
    )


def _four_lines(r: dict) -> list[str]:
    """The 4-rank part of the text report."""
    return [
        f"1F1B on 4 ranks: "
        f"bubble {r['bubble_measured']:.3f} vs formula {r['bubble_formula']:.3f}; "
        f"ours/torch {r['ratio']:.3f} (quartiles {r['ratio_quartiles']}; inputs "
        f"agreed once: {r['inputs_once_ratio']:.3f})",
        *(
            f"{name:>6} on 4 ranks: bubble {row['bubble']:.3f} vs formula "
            f"{row['formula']:.3f}, step {row['step_ms']:.1f} ms"
            for name, row in r["schedules"].items()
        ),
        f"ZB-H1 / torch's ScheduleInterleavedZeroBubble: {r['zb_ratio']:.3f} "
        f"(theirs {r['torch_zb_ms']:.1f} ms)",
        f"plain runner / our 1F1B: {r['plain_ratio']:.3f} (plain "
        f"{r['plain_ms']:.1f} ms)",
    ]
