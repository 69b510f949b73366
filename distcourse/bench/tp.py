"""`python -m distcourse.bench tp [--json] [--quick] [--ranks N ...]`: our parallel
MLP against torch's `parallelize_module` (ColwiseParallel -> RowwiseParallel).

One spawn per world size builds the same MLP (Linear(H, 4H) -> GELU -> Linear(4H, H))
three ways: torch's DTensor plan, our ParallelMLP, and ours without the shape
agreement (`check=False`: no 112-byte all_gather before each forward). They take
turns step by step, each round in the next order, so changes in machine load hit all
alike. A step is forward + backward of one (B, T, H) batch: one all_reduce each way
for every implementation. We report the median over steps of the slowest rank's
time, and of our time / torch's in the same round.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from distcourse import runtime
from distcourse.bench import common
from distcourse.examples.gpt import MLP
from distcourse.parallel.tensor import ParallelMLP

IMPLEMENTATIONS = (
    "torch parallelize_module",
    "ours (ParallelMLP)",
    "ours, check=False",
)
BENCH = common.Comparison(
    "tp", IMPLEMENTATIONS, ("ratio", "unchecked_ratio"), 25, "vs torch"
)
format_table = BENCH.table  # the rows as an aligned text table


@dataclass(frozen=True)
class Config:
    """Activation sizes (batch, tokens, width) and how many steps to time."""

    batch: int
    seq: int
    hidden: int
    warmup: int
    steps: int
    worlds: tuple[int, ...] = (4,)


FULL = Config(batch=4, seq=128, hidden=256, warmup=5, steps=100)
QUICK = Config(batch=2, seq=8, hidden=16, warmup=1, steps=3, worlds=(2,))


def _torch_mlp(mlp: nn.Module) -> nn.Module:
    """torch's tensor parallelism of the same MLP, on a 1-D CPU device mesh."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    mesh = init_device_mesh(runtime.device().type, (dist.get_world_size(),))
    plan = {"fc": ColwiseParallel(), "proj": RowwiseParallel()}
    return parallelize_module(copy.deepcopy(mlp), mesh, plan)


def _make_step(module: nn.Module, x: torch.Tensor) -> Callable[[], None]:
    def step() -> None:
        module.zero_grad(set_to_none=True)
        x.grad = None
        module(x).square().sum().backward()

    return step


def _measure(cfg: Config) -> list[list[float]]:
    """On every rank: step times in seconds, [implementation][step], slowest rank's."""
    torch.manual_seed(0)  # the same MLP and input on every rank
    device = runtime.device()  # the rank's own: a GPU on a GPU box
    mlp = MLP(cfg.hidden).to(device)
    x = torch.randn(cfg.batch, cfg.seq, cfg.hidden).to(device).requires_grad_()
    modules = [
        _torch_mlp(mlp),
        ParallelMLP.from_module(mlp),
        ParallelMLP.from_module(mlp, check=False),
    ]
    steps = [_make_step(m, x) for m in modules]
    return common.time_rounds(steps, cfg.warmup, cfg.steps)


def main(argv: list[str]) -> int:
    """Parse options, run the benchmark, print a table (or one JSON object)."""
    parser = BENCH.parser(
        "Parallel-MLP step time: ours vs torch's parallelize_module.",
        "tiny sizes, few steps",
    )
    cfg, args = common.sized(
        parser, argv, (QUICK, FULL), lambda c: 4 * c.hidden, "4 x hidden = {unit}"
    )
    rows = BENCH.run(_measure, cfg)
    model = (
        f"MLP Linear({cfg.hidden}, {4 * cfg.hidden}) -> GELU -> "
        f"Linear({4 * cfg.hidden}, {cfg.hidden}), input ({cfg.batch}, {cfg.seq}, "
        f"{cfg.hidden}); forward + backward, median of {cfg.steps} steps after "
        f"{cfg.warmup} warm-up"
    )
    verdict = (
        "ours / torch on {ranks} ranks: {ratio:.2f}; without the check: "
        "{unchecked_ratio:.2f}"
    )
    return BENCH.report(args, cfg, rows, (model, verdict), ranks=cfg.worlds[-1])
