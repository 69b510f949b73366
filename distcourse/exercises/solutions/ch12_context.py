"""Solutions to chapter 12b's exercises (`distcourse.exercises.ch12_context`)."""

from __future__ import annotations

import torch
import torch.distributed as dist


def merge(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each half weighted by its share of the probability mass, e^(lse_x − lse)."""
    lse = torch.logaddexp(lse_a, lse_b)
    return torch.exp(lse_a - lse) * out_a + torch.exp(lse_b - lse) * out_b, lse


def positions(seq: int, cp: int, rank: int) -> torch.Tensor:
    """Chunks r and 2·cp − 1 − r of c = seq / (2·cp) tokens."""
    c = seq // (2 * cp)
    chunks = (rank, 2 * cp - 1 - rank)
    return torch.cat([torch.arange(i * c, (i + 1) * c) for i in chunks])


def ring_pass(x: torch.Tensor) -> torch.Tensor:
    """Send right and receive from the left, posted together."""
    rank, n = dist.get_rank(), dist.get_world_size()
    into = torch.empty_like(x)
    ops = [dist.isend(x, (rank + 1) % n), dist.irecv(into, (rank - 1) % n)]
    for op in ops:
        op.wait()
    return into


ring_bytes = 7 * 2 * 2**20 + 7 * 4 * 2**20 + 2 * 2**20  # 44 MiB
contiguous_imbalance = 31 / 17  # rank 7: 4·7 + 3 blocks; the mean 2·8 + 1
