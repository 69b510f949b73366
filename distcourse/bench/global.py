"""`python -m distcourse.bench global [--json] [--quick] [--steps N]`: our global
tensors against DTensor on the same matmul + boxing sequence.

One step, forward and backward, on 4 ranks (the same on both sides):

    y = x @ w        S(1) x S(0) -> P       Shard(1) x Shard(0) -> Partial
    y -> B           all_reduce             redistribute(Replicate)
    z = y @ v        B x S(1) -> S(1)       Replicate x Shard(1) -> Shard(1)
    z -> B           all_gather             redistribute(Replicate)
    z.sum().backward()

The two take turns step by step, each round in the other order, so changes in
machine load hit both alike. A step lasts as long as its slowest rank; `ratio` is
the median over rounds of our step time / DTensor's in the same round. The load
average is reported beside it: the machine may be shared.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import torch
import torch.distributed as dist

import distcourse.global_tensor as gt
from distcourse import runtime
from distcourse.bench import common
from distcourse.launch import spawn

IMPLEMENTATIONS = ("torch DTensor", "ours (global_tensor)")


@dataclass(frozen=True)
class Config:
    """Matrix sizes (x is m x k, w k x k, v k x n), ranks, steps to time."""

    m: int
    k: int
    n: int
    ranks: int
    warmup: int
    steps: int


FULL = Config(m=256, k=256, n=256, ranks=4, warmup=5, steps=60)
QUICK = Config(m=8, k=8, n=8, ranks=2, warmup=1, steps=3)


def _tensors(cfg: Config) -> list[torch.Tensor]:
    torch.manual_seed(0)
    shapes = [(cfg.m, cfg.k), (cfg.k, cfg.k), (cfg.k, cfg.n)]
    return [torch.randn(shape).to(runtime.device()) for shape in shapes]


def _dtensor_step(cfg: Config) -> Callable[[], torch.Tensor]:
    from torch.distributed.tensor import (
        Replicate,
        Shard,
        distribute_tensor,
        init_device_mesh,
    )

    mesh = init_device_mesh(runtime.device().type, (dist.get_world_size(),))
    x, w, v = [
        distribute_tensor(t, mesh, [s]).requires_grad_()
        for t, s in zip(_tensors(cfg), [Shard(1), Shard(0), Shard(1)], strict=True)
    ]

    def step() -> torch.Tensor:
        for t in (x, w, v):
            t.grad = None
        y = torch.mm(x, w).redistribute(mesh, [Replicate()])
        z = torch.mm(y, v).redistribute(mesh, [Replicate()])
        z.sum().backward()
        return z.full_tensor()

    return step


def _our_step(cfg: Config) -> Callable[[], torch.Tensor]:
    world = list(range(dist.get_world_size()))
    p = gt.placement(runtime.device().type, ranks=world)
    b = gt.sbp.broadcast
    sigs = [gt.sbp.split(1), gt.sbp.split(0), gt.sbp.split(1)]
    x, w, v = [
        gt.to_global(t, p, b).to_global(sbp=s).detach().requires_grad_()
        for t, s in zip(_tensors(cfg), sigs, strict=True)
    ]

    def step() -> torch.Tensor:
        for t in (x, w, v):
            t.grad = None
        y = torch.mm(x, w).to_global(sbp=b)
        z = torch.mm(y, v).to_global(sbp=b)
        z.sum().backward()
        return z.full_tensor()

    return step


def _measure(cfg: Config) -> dict:
    """On every rank: step times [implementation][step] (slowest rank's) and
    whether both computed the same z and the same gradients."""
    steps = [_dtensor_step(cfg), _our_step(cfg)]
    outs = [s() for s in steps]
    same = torch.allclose(outs[0], outs[1], rtol=1e-4, atol=1e-3)
    times = common.time_rounds(steps, cfg.warmup, cfg.steps)
    return dict(times=times, same=same)


def run(cfg: Config) -> dict:
    """Time both; the report as a dict (what --json prints)."""
    got = spawn(_measure, cfg.ranks, cfg, deadline=600)[0]
    times = torch.tensor(got["times"])
    ratios = times[1] / times[0]
    rows = [
        dict(implementation=name, step_ms=round(1000 * t.median().item(), 3))
        for name, t in zip(IMPLEMENTATIONS, times, strict=True)
    ]
    return dict(
        benchmark="global",
        ratio=round(ratios.median().item(), 3),
        same_result=got["same"],
        ranks=cfg.ranks,
        load_average=os.getloadavg()[0],
        cpus=os.cpu_count(),
        config=asdict(cfg),
        table=rows,
    )


def main(argv: list[str]) -> int:
    """Parse options, run, print a short table (or one JSON object)."""
    parser = common.parser(
        "global",
        "matmul + boxing step time: global_tensor vs DTensor.",
        "tiny sizes, 2 ranks",
    )
    parser.add_argument("--steps", type=int, help="timed steps per implementation")
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    if args.steps:
        cfg = replace(cfg, steps=args.steps)
    result = run(cfg)
    shapes = f"x ({cfg.m}, {cfg.k}) S(1) @ w S(0) -> P -> B, @ v ({cfg.k}, {cfg.n})"
    return common.report(
        result,
        args.json,
        lambda: [
            f"{shapes} S(1) -> B, sum, backward; {cfg.ranks} ranks, median of "
            f"{cfg.steps}",
            *(
                f"  {row['implementation']:<22} {row['step_ms']:>9.2f} ms"
                for row in result["table"]
            ),
            f"ours / DTensor: {result['ratio']:.2f} (load average "
            f"{result['load_average']:.1f} on {result['cpus']} cpus)",
        ],
    )
