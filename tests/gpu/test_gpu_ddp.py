"""Data parallelism on the suite's device: our DDP and torch's, at every world size the
box allows, train as one process on the same device (loss and parameters), and every
tensor stays on that device."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from gpu_suite import TOL, diff, run
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

from distcourse import runtime
from distcourse.examples import models
from distcourse.examples.datasets import synthetic_regression
from distcourse.parallel.ddp import DDP, partition

B, STEPS, LR = 16, 3, 0.1  # global batch (divisible by 1, 2, 4), steps, SGD rate


def _model(device: torch.device) -> torch.nn.Module:
    torch.manual_seed(0)
    return models.toy_mlp(d_in=10, d_hidden=32, d_out=5).to(device)


def _dataset() -> TensorDataset:
    return TensorDataset(*synthetic_regression(B * STEPS, d_in=10, d_out=5, seed=1))


def _train(kind: str) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """On each rank: STEPS of SGD, wrapped by `kind` (or one process on the whole
    batch); the loss of each step (the mean over ranks) and the parameters."""
    info = runtime.require_initialized()
    device = info.device
    model = _model(device)
    if kind == "ours":
        net, data = DDP(model), partition(_dataset())
    elif kind == "torch":
        ids = [device.index] if device.type == "cuda" else None
        net, data = (
            DistributedDataParallel(model, device_ids=ids),
            partition(_dataset()),
        )
    else:
        net, data = model, _dataset()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    share = B if kind == "one process" else B // info.world_size
    losses = []
    for x, y in DataLoader(data, batch_size=share):
        opt.zero_grad()
        loss = F.mse_loss(net(x.to(device)), y.to(device))
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return torch.stack(losses), [p.detach() for p in model.parameters()]


def _against_one_process() -> dict[str, float]:
    want_losses, want = _train("one process")
    world = runtime.require_initialized().world_size
    found = {}
    for kind in ("ours", "torch"):
        losses, params = _train(kind)
        total = losses.clone()
        torch.distributed.all_reduce(total)  # equal shares: the mean is the batch's
        found[f"{kind} loss"] = diff(total / world, want_losses)
        found[f"{kind} parameters"] = max(
            diff(p, q) for p, q in zip(params, want, strict=True)
        )
    return found


def test_ddp_trains_as_one_process_on_the_device(world: int) -> None:
    for rank, found in enumerate(run(_against_one_process, world)):
        assert len(found) == 4 and max(found.values()) <= TOL, (rank, found)
