"""Reference fixes, one per lab: `LABS[name].check(SOLUTIONS[name])` says PASS.

Kept out of the chapter so that a reader writes their own first; the tests run each
through its lab's check. Each is the smallest change to the broken function.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def log_loss(loss: Tensor, rank: int, world: int) -> float:
    """Every rank all-reduces (a collective is called by all ranks or by none)."""
    dist.all_reduce(loss)
    return loss.item() / world


def sync_grads(grads: dict[str, Tensor], world: int) -> None:
    """The same order on every rank: by name, not by when a gradient was ready."""
    for name in sorted(grads):
        dist.all_reduce(grads[name])
        grads[name] /= world


def warmup(stage: int, stages: int, micro_batches: int) -> int:
    """No more warm-up forwards than there are micro-batches."""
    return min(stages - stage - 1, micro_batches)


def gather(preds: Tensor, world: int) -> Tensor:
    """Sizes first, then pieces padded to the largest, then each cut back."""
    size = torch.tensor([preds.shape[0]])
    sizes = [torch.zeros_like(size) for _ in range(world)]
    dist.all_gather(sizes, size)  # devicecheck: host (labs run on gloo)
    largest = max(int(s) for s in sizes)
    padded = torch.zeros(largest, *preds.shape[1:], dtype=preds.dtype)
    padded[: preds.shape[0]] = preds
    pieces = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(pieces, padded)  # devicecheck: host (labs run on gloo)
    return torch.cat([p[: int(n)] for p, n in zip(pieces, sizes, strict=True)])


def dropout_seed(seed: int, tp_rank: int, tp_size: int) -> int:
    """One seed for the whole tensor-parallel group: the same mask on every rank."""
    return seed


def sync_norm_grads(norm: nn.LayerNorm, world: int) -> None:
    """Sum the partial gradients: each rank saw only its rows of the sequence."""
    for p in norm.parameters():
        dist.all_reduce(p.grad)


def make_loader(dataset: TensorDataset, rank: int, world: int) -> DataLoader:
    """Each rank its own share of the samples."""
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=False)
    return DataLoader(dataset, batch_size=4, sampler=sampler)


def wrap(model: nn.Module) -> nn.Module:
    """DDP told that some parameters may get no gradient."""
    return DDP(model, find_unused_parameters=True)


SOLUTIONS = {
    "skipped_collective": log_loss,
    "collective_order": sync_grads,
    "pipeline_microbatches": warmup,
    "uneven_gather": gather,
    "dropout_seed": dropout_seed,
    "layernorm_sp": sync_norm_grads,
    "sampler": make_loader,
    "unused_parameters": wrap,
}
