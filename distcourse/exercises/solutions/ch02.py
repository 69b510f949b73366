"""Solutions to chapter 2's exercises (`distcourse.exercises.ch02`)."""

from __future__ import annotations

import torch
import torch.distributed as dist


def _exchange(send: torch.Tensor, recv: torch.Tensor) -> None:
    """Send to the next rank and receive from the previous one, as one batch: NCCL
    runs separate calls in issue order, and a large isend before its irecv deadlocks."""
    rank, n = dist.get_rank(), dist.get_world_size()
    ops = [
        dist.P2POp(dist.isend, send, (rank + 1) % n),
        dist.P2POp(dist.irecv, recv, (rank - 1) % n),
    ]
    for work in dist.batch_isend_irecv(ops):
        work.wait()


def ring_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """Reduce-scatter then all-gather around the ring, in place."""
    rank, n = dist.get_rank(), dist.get_world_size()
    chunks = list(torch.tensor_split(tensor.view(-1), n))
    for s in range(n - 1):  # after this loop, rank r holds chunk (r + 1) % n summed
        incoming = torch.empty_like(chunks[(rank - s - 1) % n])
        _exchange(chunks[(rank - s) % n].clone(), incoming)
        chunks[(rank - s - 1) % n] += incoming
    for s in range(n - 1):  # pass the finished chunks on
        _exchange(chunks[(rank - s + 1) % n].clone(), chunks[(rank - s) % n])
    return tensor


def ring_reduce_scatter(tensor: torch.Tensor) -> torch.Tensor:
    """The first loop of the all-reduce, shifted by one so rank r ends with chunk r."""
    rank, n = dist.get_rank(), dist.get_world_size()
    chunks = [c.clone() for c in tensor.chunk(n)]
    for s in range(n - 1):
        send, into = (rank - s - 1) % n, (rank - s - 2) % n
        incoming = torch.empty_like(chunks[into])
        _exchange(chunks[send], incoming)
        chunks[into] += incoming
    return chunks[rank]


all_reduce_bytes = 2 * 7 * 64 * 2**20 // 8  # 2(n-1)T/n
all_gather_bytes = 3 * 2**20 // 4  # (n-1)T/n
