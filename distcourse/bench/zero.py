"""`python -m distcourse.bench zero [--json] [--quick]`: ZeRO-1 and FSDP, ours vs torch.

On 4 ranks (and 2), one spawn trains identical copies of `wide_mlp` with AdamW four
ways: torch's DistributedDataParallel with torch's ZeroRedundancyOptimizer and with
ours (ZeRO-1: the drop-in swaps the optimizer's import, DDP stays torch's, so the
ratio times the optimizers alone), torch's FSDP2 `fully_shard` and ours (each Linear
a unit, then the root). They take turns step by step in rotating orders, so
load changes hit all alike; a step is forward + backward + optimizer step, timed as
the slowest rank's. `zero1_ratio` is our ZeRO-1 step over torch's, `fsdp_ratio` our
FSDP step over torch's (medians over rounds of the ratio in each round), `ratio` the
worse of the two. Bytes held per rank (parameters, gradients, optimizer state) after
the steps are reported for each, ours and torch's side by side.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import asdict

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import fully_shard as torch_fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer as TorchZero
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from distcourse import runtime
from distcourse.bench import common
from distcourse.examples import models
from distcourse.launch import spawn
from distcourse.parallel import fsdp, zero

IMPLEMENTATIONS = ("torch ZeRO-1", "ours (ZeRO-1)", "torch FSDP2", "ours (FSDP)")
PAIRS = {"zero1_ratio": (1, 0), "fsdp_ratio": (3, 2)}  # (ours, torch's) indices


Config = common.MLPConfig  # the model, batch and steps these timings use

FULL = Config(width=512, depth=4, d_in=256, batch=32, warmup=3, steps=40)
QUICK = Config(width=64, depth=3, d_in=32, batch=8, warmup=1, steps=3)


def _wrap(name: str, model: nn.Module) -> tuple[nn.Module, torch.optim.Optimizer]:
    """`model` trained the way `name` says, and its optimizer."""
    adamw = dict(lr=1e-3, weight_decay=0.01)
    if name in ("torch FSDP2", "ours (FSDP)"):
        shard = torch_fully_shard if name == "torch FSDP2" else fsdp.fully_shard
        mesh = fsdp.world_mesh()  # torch's default would be the GPU, if one is seen
        for layer in model:
            if isinstance(layer, nn.Linear):
                shard(layer, mesh=mesh)
        shard(model, mesh=mesh)
        return model, torch.optim.AdamW(model.parameters(), **adamw)
    optimizer = TorchZero if name == "torch ZeRO-1" else zero.ZeroRedundancyOptimizer
    opt = optimizer(model.parameters(), torch.optim.AdamW, **adamw)
    return DistributedDataParallel(model), opt


def _step(net: nn.Module, opt: torch.optim.Optimizer, x, y) -> Callable[[], None]:  # noqa: ANN001
    def step() -> None:
        opt.zero_grad()
        F.cross_entropy(net(x), y).backward()
        opt.step()

    return step


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a tensor: a DTensor's local piece (torch's FSDP2)."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _held(net: nn.Module, opt: torch.optim.Optimizer) -> int:
    """Bytes of parameters, gradients and optimizer state this rank holds."""
    params = [_local(p) for p in net.parameters()]
    grads = [_local(p.grad) for p in net.parameters() if p.grad is not None]
    inner = getattr(opt, "optim", opt)  # a ZeRO optimizer's local one
    state = [t for s in inner.state.values() for t in s.values() if torch.is_tensor(t)]
    tensors = [*params, *grads, *(_local(t) for t in state)]
    return sum(t.numel() * t.element_size() for t in tensors)


def _measure(cfg: Config) -> tuple[list[list[float]], list[int]]:
    """On every rank: step times [implementation][step] and bytes held (this rank)."""
    runtime.seed_everything(0, per_rank=False)
    device = runtime.device()  # the rank's own: a GPU on a GPU box
    base = models.wide_mlp(width=cfg.width, depth=cfg.depth, d_in=cfg.d_in)
    base.to(device)
    runtime.seed_everything(1)
    x = torch.randn(cfg.batch, cfg.d_in).to(device)
    y = torch.randint(0, 10, (cfg.batch,)).to(device)
    trained = [_wrap(name, copy.deepcopy(base)) for name in IMPLEMENTATIONS]
    steps = [_step(net, opt, x, y) for net, opt in trained]
    times = common.time_rounds(steps, cfg.warmup, cfg.steps)
    return times, [_held(net, opt) for net, opt in trained]


def run(cfg: Config) -> list[dict]:
    """One row per (ranks, implementation): step time, ratio to torch's, bytes."""
    rows = []
    for world in cfg.worlds:
        results = spawn(_measure, world, cfg, deadline=600)
        times = results[0][0]
        for ours, theirs in PAIRS.values():
            names = (IMPLEMENTATIONS[theirs], IMPLEMENTATIONS[ours])
            pair = common.rows(world, names, [times[theirs], times[ours]], 0)
            for row, index in zip(pair, (theirs, ours), strict=True):
                row["held_bytes"] = max(r[1][index] for r in results)
            rows += pair
    return rows


def format_table(rows: list[dict]) -> str:
    """The rows as an aligned text table, bytes held per rank beside the times."""
    table = common.table(rows, 14, "vs torch").splitlines()
    held = ["held bytes"] + [f"{r['held_bytes']:,}" for r in rows]
    return "\n".join(f"{line}  {b:>12}" for line, b in zip(table, held, strict=True))


def main(argv: list[str]) -> int:
    """Parse options, run the benchmark, print a table (or one JSON object)."""
    parser = common.parser(
        "zero",
        "Step time of our ZeRO-1 and FSDP vs torch's ZeroRedundancyOptimizer and "
        "fully_shard.",
        "tiny model, few steps",
    )
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    rows = run(cfg)
    world = max(cfg.worlds)
    found = {
        key: common.ratio_of(rows, IMPLEMENTATIONS[ours], world)
        for key, (ours, _) in PAIRS.items()
    }
    params = models.count_parameters(models.wide_mlp(cfg.width, cfg.depth, cfg.d_in))
    result = dict(
        benchmark="zero",
        ratio=max(found.values()),
        **found,
        ranks=world,
        parameters=params,
        config=asdict(cfg),
        table=rows,
    )
    model = (
        f"wide_mlp(width={cfg.width}, depth={cfg.depth}, d_in={cfg.d_in}): "
        f"{params / 1e6:.2f} M parameters, AdamW, batch {cfg.batch} per rank, "
        f"median of {cfg.steps} steps after {cfg.warmup} warm-up"
    )
    verdict = (
        f"on {world} ranks: ours / torch's ZeRO-1 {found['zero1_ratio']:.2f}, "
        f"FSDP {found['fsdp_ratio']:.2f}"
    )
    return common.report(
        result, args.json, lambda: [model, format_table(rows), verdict]
    )
