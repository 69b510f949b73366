"""A program written for PyTorch's ZeroRedundancyOptimizer (ZeRO-1), as its docs use it.

torch's DDP averages the gradients; the optimizer keeps the state of this rank's share
of the parameters only, steps it and sends the updated parameters to every rank. Each
rank trains on its own rows of chapter 9's uneven MLP (`distcourse.examples.sharding`:
plain torch, no strategy), with SGD and then AdamW; rank 0 consolidates the optimizer
state and, with `--out`, saves the parameters and that state. Swap the one import for
`from distcourse.parallel.zero import ZeroRedundancyOptimizer` and the program runs
unchanged (tests/test_scripts_zero_fsdp.py).

    python book/scripts/zero_torch.py --world 2 [--out DIR]
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

from distcourse.examples import sharding

STEPS = 3


def train(rank, world, name, out):
    """Train a fresh model with optimizer `name` under ZeRO-1; report and save."""
    model = sharding.uneven_mlp()
    ddp = DDP(model)
    optimizer_class, options = sharding.OPTIMIZERS[name]
    opt = ZeroRedundancyOptimizer(
        ddp.parameters(), optimizer_class=optimizer_class, **options
    )
    for step in range(STEPS):
        x, y = sharding.batch(step, rank)
        opt.zero_grad()
        loss = F.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
    held = sum(
        v.numel() for s in opt.optim.state.values() for v in s.values() if v.dim()
    )
    print(f"{name} rank {rank}: loss {loss.item():.4f}, optimizer state {held}")
    opt.consolidate_state_dict(to=0)
    if rank == 0 and out:
        state = {"model": model.state_dict(), "optimizer": opt.state_dict()}
        torch.save(state, os.path.join(out, f"zero-{name}-{world}.pt"))


def run(rank, world, out):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29511")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    for name in ("SGD", "AdamW"):
        train(rank, world, name, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    mp.spawn(run, args=(args.world, args.out), nprocs=args.world, join=True)
