"""Negative controls of chapter 1: each verdict it prints, shown failing on a fault.

The chapter trains `toy_mlp` under torch's DDP, each rank on its own 32 samples, and
checks that the replicas agree bit for bit and that the run equals one process
trained on all the samples. Here the same loop and the same checks run on 2 ranks,
once as written (PASS) and once with a planted fault (FAIL), in one spawn.
"""

from __future__ import annotations

import ddp_faults
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from distcourse import checks, runtime
from distcourse.examples import datasets, models
from distcourse.launch import spawn
from distcourse.parallel import replicas

STEPS, LR = 20, 0.05  # the chapter's loop


def _train(fault: str | None) -> tuple[torch.nn.Module, list[float]]:
    """The chapter's DDP loop on this rank's 32 samples, with `fault` planted."""
    rank = dist.get_rank()
    runtime.seed_everything(0, per_rank=False)
    model = models.toy_mlp()
    ddp = DistributedDataParallel(model)
    if fault == "sum":
        ddp.register_comm_hook(None, ddp_faults.summed_hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=LR)
    x, y = datasets.synthetic_regression(32, seed=rank)
    losses = []
    for _ in range(STEPS):
        optimizer.zero_grad()
        if fault == "no_sync":  # DDP's all-reduce skipped: each rank alone
            with ddp.no_sync():
                loss = F.mse_loss(ddp(x), y)
                loss.backward()
        else:
            loss = F.mse_loss(ddp(x), y)
            loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return model, losses


def _one_process(world: int) -> tuple[torch.nn.Module, list[float]]:
    """The chapter's reference: one process, the same loop on every rank's samples."""
    runtime.seed_everything(0, per_rank=False)
    alone = models.toy_mlp()
    optimizer = torch.optim.SGD(alone.parameters(), lr=LR)
    shards = [datasets.synthetic_regression(32, seed=r) for r in range(world)]
    x_all, y_all = (torch.cat(parts) for parts in zip(*shards, strict=True))
    losses = []
    for _ in range(STEPS):
        optimizer.zero_grad()
        loss = F.mse_loss(alone(x_all), y_all)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return alone, losses


def _verdicts() -> dict[str, dict[str, object]]:
    """On each rank: the chapter's three checks, as written and under each fault."""
    world = dist.get_world_size()
    alone, alone_losses = _one_process(world)
    found = {}
    for fault in (None, "sum", "no_sync", "ulp"):
        model, losses = _train(None if fault == "ulp" else fault)
        if fault == "ulp" and dist.get_rank() == 1:  # one weight, one ulp apart
            weight = model[0].weight.data
            weight[0, 0] = torch.nextafter(weight[0, 0], torch.tensor(1.0))
        mean = torch.tensor(losses)
        dist.all_reduce(mean)  # the sum over ranks of each step's loss
        gap = (mean / world - torch.tensor(alone_losses)).abs().max().item()
        found[str(fault)] = {
            "identical": replicas.same_on_all_ranks(model),
            "losses": checks.verdict(gap, 1e-6),
            "parameters": checks.verdict(checks.max_difference(model, alone), 1e-6),
        }
    return found


@pytest.fixture(scope="module")
def verdicts() -> list[dict[str, dict[str, object]]]:
    """Each rank's verdicts: the chapter prints each rank's, shown once when equal."""
    return spawn(_verdicts, 2)


def test_as_written_every_check_passes(verdicts: list[dict]) -> None:
    for found in verdicts:
        assert found["None"]["identical"] is True
        assert found["None"]["losses"].endswith("PASS")
        assert found["None"]["parameters"].endswith("PASS")


@pytest.mark.controls(
    "01_quickstart",
    r"parameters identical on all ranks: True",
    fault="DDP's all-reduce skipped (every step under no_sync): each rank follows "
    "its own data",
)
@pytest.mark.controls(
    "01_quickstart",
    r"parameters identical on all ranks: True",
    fault="one weight of rank 1's replica one ulp apart (torch.nextafter)",
)
def test_replicas_that_drift_apart_are_not_identical(verdicts: list[dict]) -> None:
    for found in verdicts:  # a collective: every rank reaches the same verdict
        assert found["no_sync"]["identical"] is False
        assert found["ulp"]["identical"] is False


@pytest.mark.controls(
    "01_quickstart",
    r"mean loss of the ranks vs one process: .*PASS",
    fault="DDP's gradients summed over the ranks, not averaged (a comm hook "
    "without the division)",
)
@pytest.mark.controls(
    "01_quickstart",
    r"parameters vs one process: .*PASS",
    fault="DDP's gradients summed over the ranks, not averaged (a comm hook "
    "without the division)",
)
def test_a_ddp_that_sums_gradients_is_not_one_process(verdicts: list[dict]) -> None:
    for found in verdicts:
        assert found["sum"]["losses"].endswith("FAIL")
        assert found["sum"]["parameters"].endswith("FAIL")
