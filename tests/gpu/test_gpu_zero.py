"""Sharded training on the suite's device: ZeRO-1 (our ZeroRedundancyOptimizer beside
our DDP) and FSDP (our fully_shard per Linear, then the root) train as one process on
the same device with plain SGD, at every world size the box allows; every shard and
every gathered parameter stays on that device."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from gpu_suite import TOL, diff, run
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from distcourse import runtime
from distcourse.examples import models
from distcourse.examples.datasets import synthetic_regression
from distcourse.parallel.ddp import DDP, partition
from distcourse.parallel.fsdp import full_state_dict, fully_shard
from distcourse.parallel.zero import ZeroRedundancyOptimizer

B, STEPS, LR = 16, 3, 0.1  # global batch (divisible by 1, 2, 4), steps, SGD rate


def _model(device: torch.device) -> nn.Sequential:
    torch.manual_seed(0)  # 33 hidden units: rows that do not split evenly over 2 or 4
    return models.toy_mlp(d_in=10, d_hidden=33, d_out=5).to(device)


def _dataset() -> TensorDataset:
    return TensorDataset(*synthetic_regression(B * STEPS, d_in=10, d_out=5, seed=1))


def _train(kind: str) -> dict[str, torch.Tensor]:
    """STEPS of SGD with `kind` ('zero1', 'fsdp' or one process on the whole batch);
    the full parameters after, by name, and a check that the shards sit on the
    device."""
    info = runtime.require_initialized()
    model = _model(info.device)
    net, data, share = model, _dataset(), B
    if kind == "zero1":
        net, data, share = DDP(model), partition(_dataset()), B // info.world_size
        opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.SGD, lr=LR)
    elif kind == "fsdp":
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        fully_shard(model)
        data, share = partition(_dataset()), B // info.world_size
        opt = torch.optim.SGD(model.parameters(), lr=LR)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=LR)
    assert all(p.device == info.device for p in model.parameters()), kind
    for x, y in DataLoader(data, batch_size=share):
        opt.zero_grad()
        F.mse_loss(net(x.to(info.device)), y.to(info.device)).backward()
        opt.step()
    if kind == "fsdp":
        return full_state_dict(model)
    return {k: v.detach() for k, v in model.state_dict().items()}


def _against_one_process() -> dict[str, float]:
    want = _train("one process")
    found = {}
    for kind in ("zero1", "fsdp"):
        got = _train(kind)
        assert sorted(got) == sorted(want), (kind, sorted(got))
        found[kind] = max(diff(got[k].to(want[k].device), want[k]) for k in want)
    return found


def test_zero1_and_fsdp_train_as_one_process_on_the_device(world: int) -> None:
    for rank, found in enumerate(run(_against_one_process, world)):
        assert len(found) == 2 and max(found.values()) <= TOL, (rank, found)
