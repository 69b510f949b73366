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

import os

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from distcourse.examples import sharding


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
    losses = sharding.train(model, opt, rank)
    print(f"{name} rank {rank}: loss {losses[-1]:.4f}")
    full = StateDictOptions(full_state_dict=True)
    state = get_model_state_dict(model, options=full)
    if rank == 0 and out:
        torch.save(state, os.path.join(out, f"fsdp-{name}-{world}.pt"))


if __name__ == "__main__":
    sharding.main(train, port=29512)
