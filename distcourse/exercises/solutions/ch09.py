"""Solutions to chapter 9's exercises (`distcourse.exercises.ch09`)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from distcourse import torchcompat

psi, n = 10**9, 8
zero2_bytes = 4 * psi + 12 * psi // n  # parameters whole; gradients, Adam sharded
zero3_bytes = 16 * psi // n  # everything sharded
fsdp_rows = [3, 3, 3, 1]  # torch.chunk: ceil(10 / 4) = 3 rows, 1 left for the last


def reduce_scatter_grads(flat_grad: torch.Tensor) -> torch.Tensor:
    """Sum over ranks, keep chunk `rank`, divide by the world size."""
    world = dist.get_world_size()
    shard = torch.empty(flat_grad.numel() // world, dtype=flat_grad.dtype)
    # dist.reduce_scatter_single on torch 2.14, reduce_scatter_tensor before it
    torchcompat.reduce_scatter_tensor(shard, flat_grad)
    return shard / world
