"""Solutions to chapters 3 and 3b's exercises (`distcourse.exercises.ch03`)."""

from __future__ import annotations

import torch.distributed as dist
from torch import nn


def average_gradients(model: nn.Module) -> None:
    """Sum every gradient over the ranks, then divide: the mean of the ranks' means."""
    world = dist.get_world_size()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world


def buckets(sizes: list[int], cap: int) -> list[list[int]]:
    """Last parameter first; a bucket closes once it holds `cap` bytes or more."""
    out: list[list[int]] = []
    current: list[int] = []
    held = 0
    for i in reversed(range(len(sizes))):
        current.append(i)
        held += sizes[i]
        if held >= cap:
            out.append(current)
            current, held = [], 0
    if current:
        out.append(current)
    return out


sampler_repeats = 2  # 3 x 450 = 1,350 = 1,348 + 2
ddp_bytes = 2 * 3 * 10_000_000 // 4  # 2(n-1)/n of 10 MB of gradients
ddp_memory = 20 * 1_000_000  # 4 + 4 + 4 + 8 bytes per parameter
