"""`python -m distcourse.bench experts [--json] [--quick] [--ranks N ...]`: our
expert-parallel MoE layer against one process running every expert.

torch 2.14 has no mixture-of-experts layer in its core (torch.nn has none, and
torch.distributed has no expert parallelism; torchtitan's lives outside), so the
baseline is ours in one process: the same MoE layer, every expert local, routing
the tokens of all n ranks as n groups (the same work, the same drops). It runs on
rank 0 while the others wait; ours runs on n ranks, each with its own tokens and
E / n experts: a step is forward + backward, the counts, dispatch and combine
all_to_alls included. Rounds alternate the two (`common.time_rounds`); we report
the median of the slowest rank's step time, and of ours / one process's
(`ratio`: below 1 when splitting the experts pays for the all_to_alls).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from distcourse import runtime
from distcourse.bench import common
from distcourse.parallel.experts import MoE, shard_experts

IMPLEMENTATIONS = ("one process (all experts)", "ours (experts over ranks)")
BENCH = common.Comparison("experts", IMPLEMENTATIONS, ("ratio",), 26, "vs one process")
format_table = BENCH.table  # the rows as an aligned text table


@dataclass(frozen=True)
class Config:
    """Tokens per rank, width, experts, top-k, capacity and how many steps to time."""

    tokens: int
    hidden: int
    experts: int
    top_k: int
    capacity_factor: float
    warmup: int
    steps: int
    worlds: tuple[int, ...] = (4,)


FULL = Config(256, 128, 8, 2, 1.25, warmup=3, steps=30)
QUICK = Config(16, 16, 4, 2, 1.25, warmup=1, steps=3, worlds=(2,))


def _make_step(moe: MoE, x: torch.Tensor, run_here: bool) -> Callable[[], None]:
    def step() -> None:
        if run_here:
            moe.zero_grad(set_to_none=True)
            moe(x).square().sum().backward()

    return step


def _measure(cfg: Config) -> list[list[float]]:
    """On every rank: step times in seconds, [implementation][step], slowest rank's."""
    torch.set_num_threads(1)
    n, rank = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(0)  # the same layer and tokens on every rank, on its device
    moe = MoE(cfg.hidden, cfg.experts, cfg.top_k, cfg.capacity_factor)
    moe.to(runtime.device())
    x = torch.randn(n * cfg.tokens, cfg.hidden).to(runtime.device())
    alone = copy.deepcopy(moe)
    alone.groups = n
    shard_experts(moe, None)
    mine = x[rank * cfg.tokens : (rank + 1) * cfg.tokens]
    steps = [_make_step(alone, x, rank == 0), _make_step(moe, mine, True)]
    return common.time_rounds(steps, cfg.warmup, cfg.steps)


def main(argv: list[str]) -> int:
    """Parse options, run the benchmark, print a table (or one JSON object)."""
    parser = BENCH.parser(
        "MoE layer step time: experts over ranks vs one process holding them all.",
        "tiny sizes, few steps",
    )
    cfg, args = common.sized(
        parser, argv, (QUICK, FULL), lambda c: c.experts, "the {unit} experts"
    )
    rows = BENCH.run(_measure, cfg)
    model = (
        f"MoE: {cfg.experts} experts MLP({cfg.hidden}, {4 * cfg.hidden}), "
        f"top-{cfg.top_k}, capacity factor {cfg.capacity_factor}, "
        f"{cfg.tokens} tokens per rank; forward + backward, median of "
        f"{cfg.steps} steps after {cfg.warmup} warm-up"
    )
    verdict = (
        "ours / one process on {ranks} ranks: {ratio:.2f} (torch has no MoE "
        "layer in its core to time beside them)"
    )
    return BENCH.report(
        args,
        cfg,
        rows,
        (model, verdict),
        torch_moe="none: torch has no MoE layer in its core",
        ranks=cfg.worlds[-1],
    )
