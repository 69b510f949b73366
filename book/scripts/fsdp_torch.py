"""A program written for PyTorch's FSDP2: `fully_shard` per layer, then the root, and
`get_model_state_dict` for a full checkpoint.

Each rank keeps its dim-0 piece of every parameter, and the optimizer, built after
sharding on `model.parameters()`, keeps state for those pieces only. Each rank trains
on its own rows of chapter 9's uneven MLP (`distcourse.examples.sharding`: plain
torch, no strategy), with SGD and then AdamW; the full state dict is gathered on
every rank and, with `--out`, rank 0 saves it. Swap the `fully_shard` import for
`from distcourse.parallel.fsdp import fully_shard, full_state_dict` and the
`get_model_state_dict` line for `full_state_dict(model)`, and the program runs
unchanged otherwise (tests/test_scripts_zero_fsdp.py).

    python book/scripts/fsdp_torch.py --world 2 [--out DIR]
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from distcourse.examples import sharding

STEPS = 3


def train(rank, world, name, out):
    """Train a fresh model with optimizer `name` under FSDP; report and save."""
    model = sharding.uneven_mlp()
    # gloo ranks compute on the CPU: say so, as torch's default mesh would take the
    # GPU whenever one is visible
    mesh = init_device_mesh("cpu", (world,))  # devicecheck: host
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = sharding.optimizer(name, model.parameters())
    for step in range(STEPS):
        x, y = sharding.batch(step, rank)
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    print(f"{name} rank {rank}: loss {loss.item():.4f}")
    full = StateDictOptions(full_state_dict=True)
    state = get_model_state_dict(model, options=full)
    if rank == 0 and out:
        torch.save(state, os.path.join(out, f"fsdp-{name}-{world}.pt"))


def run(rank, world, out):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29512")
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
