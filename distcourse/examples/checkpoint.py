"""Checkpoints that resume in the middle of an epoch and give the same numbers.

A run continues exactly where it stopped only if everything that decides the next
step is saved: the weights, the optimizer's state (momentum), the LR scheduler, the
position in the epoch, and the state of every random generator the step draws from
(torch: dropout; numpy and python: augmentation). The generators are per rank, so
every rank's states go into the one file rank 0 writes. `train` is the demonstration:
a data-parallel run with all of these, that can stop, resume, or forget one part.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, Sampler, TensorDataset

from distcourse.examples.datasets import synthetic_regression

PARTS = ("rng", "scheduler", "position")  # what `train(forget=...)` can leave out


class SkipSampler(Sampler[int]):
    """`sampler`'s indices without the first `skip`: the rest of a started epoch."""

    def __init__(self, sampler: Sampler[int], skip: int) -> None:
        self.sampler, self.skip = sampler, skip

    def __iter__(self) -> Iterator[int]:
        for i, index in enumerate(self.sampler):
            if i >= self.skip:
                yield index

    def __len__(self) -> int:
        return max(len(self.sampler) - self.skip, 0)  # type: ignore[arg-type]


def rng_states(device: torch.device | None = None) -> dict[str, Any]:
    """This process's torch, numpy and python generator states, and `device`'s
    (a GPU draws dropout masks from a generator of its own)."""
    states = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    if device is not None and device.type != "cpu":
        states["device"] = torch.get_device_module(device).get_rng_state(device)
    return states


def set_rng_states(states: dict[str, Any], device: torch.device | None = None) -> None:
    """Put back what `rng_states` returned."""
    torch.set_rng_state(states["torch"])
    if "device" in states:
        torch.get_device_module(device).set_rng_state(states["device"], device)
    np.random.set_state(states["numpy"])
    random.setstate(states["python"])


def seed_all(seed: int) -> None:
    """Seed torch, numpy and python's generators alike."""
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def build(
    device: torch.device | str = "cpu",
) -> tuple[nn.Module, torch.optim.Optimizer, Any, TensorDataset]:
    """The run's model (with dropout) on `device`, SGD with momentum, a step LR
    schedule, data (on the host, as a loader's are)."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(10, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 5)
    ).to(device)  # before the optimizer takes its parameters
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.5)
    return model, optimizer, scheduler, TensorDataset(*synthetic_regression(64))


def augment(x: torch.Tensor) -> torch.Tensor:
    """Random noise (numpy draws its size) and a random sign flip (python draws it)."""
    x = x + float(np.random.uniform(0, 0.1)) * torch.ones_like(x)
    return -x if random.random() < 0.5 else x


def train(
    path: str | Path,
    epochs: int = 3,
    batch: int = 8,
    stop_after: int | None = None,
    resume: bool = False,
    forget: Sequence[str] = (),
    device: torch.device | str = "cpu",
) -> list[float]:
    """Train on every rank of the default group, the model on `device` (the rank's
    own: `runtime.device()`); return this rank's step losses.

    `stop_after=k`: after k steps rank 0 saves the checkpoint to `path` and the run
    stops. `resume`: start from that checkpoint (loaded with map_location, on every
    rank) and return the losses of the steps after it. `forget`: parts of `PARTS` not
    restored, to show that each one matters.
    """
    if unknown := set(forget) - set(PARTS):
        raise ValueError(f"forget: unknown parts {sorted(unknown)}; known: {PARTS}")
    rank, world, device = dist.get_rank(), dist.get_world_size(), torch.device(device)
    model, optimizer, scheduler, dataset = build(device)
    ddp = DistributedDataParallel(model)
    sampler = DistributedSampler(dataset, world, rank, shuffle=True, seed=0)
    seed_all(1 + rank)  # each rank its own dropout masks and augmentation
    epoch = step = done = 0
    if resume:
        state = torch.load(path, map_location=device, weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        if "scheduler" not in forget:
            scheduler.load_state_dict(state["scheduler"])
        if "rng" not in forget:
            set_rng_states(state["rng"][rank], device)
        epoch, done = state["epoch"], state["done"]
        step = 0 if "position" in forget else state["step"]
    losses: list[float] = []
    while epoch < epochs:
        sampler.set_epoch(epoch)
        rest = SkipSampler(sampler, step * batch)
        # a generator of its own: else each new iterator draws from torch's global one
        loader = DataLoader(dataset, batch, sampler=rest, generator=torch.Generator())
        for x, y in loader:
            if done == stop_after:
                save(path, ddp, optimizer, scheduler, (epoch, step, done), device)
                return losses
            optimizer.zero_grad()
            x, y = x.to(device), y.to(device)
            loss = F.mse_loss(ddp(augment(x)), y)
            loss.backward()
            optimizer.step()
            scheduler.step()
            losses.append(loss.item())
            step, done = step + 1, done + 1
        epoch, step = epoch + 1, 0
    return losses


def save(
    path: str | Path,
    ddp: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    position: tuple[int, int, int],
    device: torch.device | None = None,
) -> None:
    """Rank 0 writes everything; every rank's generator states travel to it first.
    `position`: (epoch, step in the epoch, steps done)."""
    epoch, step, done = position
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, rng_states(device))
    if dist.get_rank() == 0:
        state = {
            "model": ddp.module.state_dict(),  # the plain model: loads without DDP
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "rng": everyone,
            "epoch": epoch,
            "step": step,
            "done": done,
        }
        torch.save(state, path)
    dist.barrier()  # nobody loads before rank 0 has written
