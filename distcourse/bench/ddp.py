"""`python -m distcourse.bench ddp [--json] [--quick]`: our DDP against torch's.

For each world size, one spawn trains three identical copies of `wide_mlp` in the same
process group: torch's DistributedDataParallel, our `DDP`, and the naive
`average_gradients` after backward. They take turns step by step, each round in the
next of the six possible orders, so changes in machine load (and who runs after whom)
hit all three alike. A step is forward + backward + optimizer step; we report the
median over steps of the slowest rank's time.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from distcourse import runtime
from distcourse.bench import common
from distcourse.examples import models
from distcourse.parallel.ddp import DDP, average_gradients

IMPLEMENTATIONS = ("torch DDP", "ours (DDP)", "naive average")
BENCH = common.Comparison(
    "ddp", IMPLEMENTATIONS, ("ratio", "naive_ratio"), 15, "vs torch DDP"
)
format_table = BENCH.table  # the rows as an aligned text table
BUCKET_MB = 25.0  # torch's default cap; see the chapter for how the size was tuned


Config = common.MLPConfig  # the model, batch and steps these timings use

FULL = Config(width=1024, depth=4, d_in=256, batch=32, warmup=5, steps=200)
QUICK = Config(width=64, depth=3, d_in=32, batch=8, warmup=1, steps=3)


def _make_step(
    name: str, model: nn.Module, x: torch.Tensor, y: torch.Tensor, bucket_mb: float
) -> Callable[[], None]:
    """One training step of `model` wrapped the way `name` says."""
    net: nn.Module = model
    if name == "torch DDP":
        net = DistributedDataParallel(model)
    elif name == "ours (DDP)":
        net = DDP(model, bucket_cap_mb=bucket_mb)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step() -> None:
        optimizer.zero_grad()
        F.cross_entropy(net(x), y).backward()
        if name == "naive average":
            average_gradients(model)
        optimizer.step()

    return step


def _measure(cfg: Config, bucket_mb: float) -> list[list[float]]:
    """On every rank: step times in seconds, [implementation][step], slowest rank's."""
    runtime.seed_everything(0, per_rank=False)  # the same model on every rank
    device = runtime.device()  # the rank's own: a GPU on a GPU box
    base = models.wide_mlp(width=cfg.width, depth=cfg.depth, d_in=cfg.d_in)
    base.to(device)
    runtime.seed_everything(1)  # different data on every rank
    x = torch.randn(cfg.batch, cfg.d_in).to(device)
    y = torch.randint(0, 10, (cfg.batch,)).to(device)
    steps = [
        _make_step(name, copy.deepcopy(base), x, y, bucket_mb)
        for name in IMPLEMENTATIONS
    ]
    return common.time_rounds(steps, cfg.warmup, cfg.steps)


def main(argv: list[str]) -> int:
    """Parse options, run the benchmark, print a table (or one JSON object)."""
    parser = BENCH.parser(
        "Step time of our DDP vs torch DDP vs naive gradient averaging.",
        "tiny model, few steps",
    )
    parser.add_argument("--bucket-mb", type=float, default=BUCKET_MB)
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    rows = BENCH.run(_measure, cfg, args.bucket_mb, deadline=300)
    params = models.count_parameters(models.wide_mlp(cfg.width, cfg.depth, cfg.d_in))
    model = (
        f"wide_mlp(width={cfg.width}, depth={cfg.depth}, d_in={cfg.d_in}): "
        f"{params / 1e6:.2f} M parameters, batch {cfg.batch} per rank, "
        f"median of {cfg.steps} steps after {cfg.warmup} warm-up, "
        f"our buckets {args.bucket_mb:g} MB"
    )
    verdict = (
        "ours / torch DDP on {ranks} ranks: {ratio:.2f}; "
        "naive / torch DDP: {naive_ratio:.2f}"
    )
    return BENCH.report(
        args,
        cfg,
        rows,
        (model, verdict),
        bucket_cap_mb=args.bucket_mb,
        parameters=params,
    )
