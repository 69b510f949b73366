"""A plain training loop and an evaluation, shared by the chapters and their scripts."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from tqdm import tqdm


def fit(
    model: nn.Module,
    loader: DataLoader,
    optimizer: torch.optim.Optimizer,
    epochs: int,
    device: torch.device | str = "cpu",
    progress: bool = False,
) -> list[float]:
    """Train for `epochs` with cross-entropy; return the loss of every step.

    With a DistributedSampler, `set_epoch` reshuffles each epoch the same way on every
    rank. `progress` shows one bar over epochs (only ask for it on one rank); it shows
    no timings, so it prints the same text on every run.
    """
    sampler = loader.sampler
    losses: list[float] = []
    bar = tqdm(
        range(epochs),
        disable=not progress,
        mininterval=0,
        bar_format="epoch {n_fmt}/{total_fmt} |{bar:20}|{postfix}",
    )
    model.train()
    for epoch in bar:
        if isinstance(sampler, DistributedSampler):
            sampler.set_epoch(epoch)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        bar.set_postfix_str(f"loss {losses[-1]:.3f}", refresh=False)
    bar.close()
    return losses


@torch.no_grad()
def accuracy(
    model: nn.Module, dataset: Dataset, device: torch.device | str = "cpu"
) -> float:
    """Fraction of `dataset` that `model` classifies correctly (all of it, here)."""
    model.eval()
    correct = total = 0
    for x, y in DataLoader(dataset, batch_size=256):
        pred = model(x.to(device)).argmax(dim=1)
        correct += (pred == y.to(device)).sum().item()
        total += len(y)
    return correct / total


def sgd_steps(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int = 20, lr: float = 0.1
) -> list[float]:
    """`steps` full-batch SGD steps with mean-squared error; the loss of each.

    The ToyModel of OneFlow's global-tensor tutorial trains this way. `model` may be
    wrapped in a DDP (then x, y are this rank's share of the batch, and the loss is
    this rank's).
    """
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses
