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

import os

import torch
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

from distcourse.examples import sharding


def train(rank, world, name, out):
    """Train a fresh model with optimizer `name` under ZeRO-1; report and save."""
    model = sharding.uneven_mlp()
    ddp = DDP(model)
    optimizer_class, options = sharding.OPTIMIZERS[name]
    opt = ZeroRedundancyOptimizer(
        ddp.parameters(), optimizer_class=optimizer_class, **options
    )
    losses = sharding.train(ddp, opt, rank)
    held = sum(
        v.numel() for s in opt.optim.state.values() for v in s.values() if v.dim()
    )
    print(f"{name} rank {rank}: loss {losses[-1]:.4f}, optimizer state {held}")
    opt.consolidate_state_dict(to=0)
    if rank == 0 and out:
        state = {"model": model.state_dict(), "optimizer": opt.state_dict()}
        torch.save(state, os.path.join(out, f"zero-{name}-{world}.pt"))


if __name__ == "__main__":
    sharding.main(train, port=29511)
