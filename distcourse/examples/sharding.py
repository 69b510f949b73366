"""Chapter 9's model, batches and one-process run: what ZeRO and FSDP must equal.

The model's shapes are uneven on purpose (171 numbers in 6 tensors; on 4 ranks the
last layer's 3 rows leave one rank an empty dim-0 piece), so no strategy can pass by
splitting evenly. Each rank draws its own rows (`batch(step, rank)`); one process
trains on every rank's rows at once, which is what the ranks together must match.
Nothing here knows about ranks: the world size is an argument.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

ROWS = 4  # rows per rank per step
OPTIMIZERS: dict[str, tuple[type[torch.optim.Optimizer], dict]] = {
    "SGD": (torch.optim.SGD, dict(lr=0.1)),
    "AdamW": (torch.optim.AdamW, dict(lr=0.01, weight_decay=0.1)),
}


def uneven_mlp() -> nn.Sequential:
    """Linear(6, 10) -> Tanh -> Linear(10, 7) -> Tanh -> Linear(7, 3), seeded."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 7), nn.Tanh(), nn.Linear(7, 3)
    )


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank `rank`'s rows (x, y) at `step`: the same on any machine."""
    gen = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(ROWS, 6, generator=gen), torch.randn(ROWS, 3, generator=gen)


def optimizer(kind: str, params: object) -> torch.optim.Optimizer:
    """A fresh optimizer of `kind` ("SGD" or "AdamW") over `params`."""
    cls, options = OPTIMIZERS[kind]
    return cls(params, **options)


def train(
    net: nn.Module,
    opt: torch.optim.Optimizer,
    rank: int,
    steps: int = 3,
    before_step: Callable[[], None] | None = None,
    device: torch.device | str = "cpu",
) -> list[float]:
    """`steps` steps of mean-squared error on this rank's rows (moved to `device`,
    the model's); `before_step` runs between backward and the step. The losses."""
    losses = []
    for step in range(steps):
        x, y = (t.to(device) for t in batch(step, rank))
        opt.zero_grad()
        loss = F.mse_loss(net(x), y)
        loss.backward()
        if before_step is not None:
            before_step()
        opt.step()
        losses.append(loss.item())
    return losses


def one_process(
    world: int, kind: str, steps: int = 3, make: Callable[[], nn.Module] = uneven_mlp
) -> dict[str, torch.Tensor]:
    """The state dict after training `make()` (seeded) on all `world` ranks' rows in
    one process."""
    model = make()
    opt = optimizer(kind, model.parameters())
    for step in range(steps):
        rows = [batch(step, r) for r in range(world)]
        x, y = torch.cat([r[0] for r in rows]), torch.cat([r[1] for r in rows])
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
    return model.state_dict()


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Largest absolute difference between two state dicts with the same keys (on
    any devices: compared on the host)."""
    if a.keys() != b.keys():
        raise ValueError(f"different keys: {sorted(a)} and {sorted(b)}")
    return max((a[k].cpu() - b[k].cpu()).abs().max().item() for k in a)


def main(train: Callable[[int, int, str, str], None], port: int) -> None:
    """The launcher chapter 9's two torch programs share (book/scripts/zero_torch.py,
    fsdp_torch.py), as PyTorch's tutorials write one: `--world` ranks by mp.spawn,
    each joining gloo on MASTER_ADDR:MASTER_PORT (loopback, `port`, unless set), then
    `train(rank, world, name, out)` for SGD and then AdamW, `--out` the folder rank
    0 saves into (none: nothing saved)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    mp.spawn(_run, args=(args.world, args.out, train, port), nprocs=args.world)


def _run(rank: int, world: int, out: str, train: Callable, port: int) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    for name in OPTIMIZERS:
        train(rank, world, name, out)
    dist.destroy_process_group()
