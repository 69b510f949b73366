"""Global tensors on `placement(<the rank's device type>, ...)`: pieces live on the
rank's device; boxing (S -> B, P -> B, B -> S) gives the logical tensor; a two-layer
model trained data parallel, model parallel (column then row) and, on 4 ranks, 2-D
gives one process's losses and gradients on the same device."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from gpu_suite import TOL, diff, run
from torch import nn

import distcourse.global_tensor as gt
from distcourse import runtime

S0, S1 = gt.sbp.split(0), gt.sbp.split(1)
B, P = gt.sbp.broadcast, gt.sbp.partial_sum
COLUMN_ROW = {"0.weight": S0, "0.bias": S0, "2.weight": S1}


def _layouts(world: int) -> dict[str, tuple]:
    """name: (placement ranks, data signature, parameter plan) for this world."""
    ranks = list(range(world))
    found = {"data parallel": (ranks, S0, {}), "model parallel": (ranks, B, COLUMN_ROW)}
    if world == 4:
        plan = {k: (B, v) for k, v in COLUMN_ROW.items()}
        found["2-D"] = ([[0, 1], [2, 3]], (S0, B), plan)
    return found


def _boxing(world: int) -> dict[str, float]:
    """Conversions of an (8, 4) tensor, each against the whole tensor."""
    p = gt.placement(runtime.device().type, ranks=list(range(world)))
    gen = torch.Generator().manual_seed(2)
    whole = torch.randn(8, 4, generator=gen).to(runtime.device())
    x = gt.to_global(whole, p, B)
    assert x.to_local().device == runtime.device()
    split = x.to_global(sbp=S0)
    summed = (split * 2).sum(0)  # a sum over the split dim: partial
    return {
        "B -> S(0) -> B": diff(split.full_tensor(), whole),
        "S(0) sum -> P -> B": diff(summed.full_tensor(), (whole * 2).sum(0)),
        "S(0) -> S(1)": diff(split.to_global(sbp=S1).full_tensor(), whole),
    }


def _train(ranks: list, data_sig: object, plan: dict) -> dict[str, float]:
    """3 SGD steps of a global model and of one process; losses and gradients."""
    device = runtime.device()
    p = gt.placement(device.type, ranks=ranks)
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(10, 8), nn.ReLU(), nn.Linear(8, 4)).to(device)
    model = gt.parallelize(copy.deepcopy(ref), p, plan, rest=B)
    b = (B,) * p.ndim
    losses: tuple[list[float], list[float]] = ([], [])
    for m, out in zip((model, ref), losses, strict=True):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        torch.manual_seed(1)
        for _ in range(3):
            x, y = torch.randn(8, 10).to(device), torch.randn(8, 4).to(device)
            if m is model:
                x, y = (gt.to_global(t, p, b).to_global(sbp=data_sig) for t in (x, y))
            loss = F.mse_loss(m(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            out.append(loss.item())
    pairs = zip(model.parameters(), ref.parameters(), strict=True)
    return {
        "loss": max(abs(a - b) for a, b in zip(*losses, strict=True)),
        "gradients": max(diff(q.grad.full_tensor(), r.grad) for q, r in pairs),
    }


def _against_one_process() -> dict[str, float]:
    world = torch.distributed.get_world_size()
    found = _boxing(world)
    for name, (ranks, data_sig, plan) in _layouts(world).items():
        got = _train(ranks, data_sig, plan)
        found.update({f"{name} {k}": v for k, v in got.items()})
    return found


def test_global_tensors_on_the_device_equal_one_process(world: int) -> None:
    for rank, found in enumerate(run(_against_one_process, world)):
        assert len(found) >= 7 and max(found.values()) <= TOL, (rank, found)
