"""GlobalTensor with nn, autograd and torch.optim unchanged: OneFlow's two programs
(data parallel and model parallel) equal one process, step by step; Adam too; and
DTensor gives the same values where it has the same layout.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

import distcourse.global_tensor as gt
from distcourse import checks
from distcourse.launch import spawn

STEPS = 20


class ToyModel(nn.Module):
    """OneFlow's data-parallel example model."""

    def __init__(self) -> None:
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net2(self.relu(self.net1(x)))


def _train(model: nn.Module, data: list, opt: str = "sgd") -> list[float]:
    """The single-device loop: the same lines on global and plain tensors."""
    loss_fn = nn.MSELoss()
    optimizer = (
        torch.optim.SGD(model.parameters(), lr=0.05)
        if opt == "sgd"
        else torch.optim.Adam(model.parameters(), lr=0.01)
    )
    losses = []
    for x, y in data:
        loss = loss_fn(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def _close(a: list[float], b: list[float]) -> bool:
    pairs = zip(a, b, strict=True)
    return len(a) == len(b) and all(abs(x - y) <= 1e-5 for x, y in pairs)


def _data(n: int, make: object) -> list:
    torch.manual_seed(1)
    return [(make(20, 10), make(20, 5)) for _ in range(n)]


def _data_parallel(opt: str) -> tuple[list, list, bool]:
    placement = gt.placement("cpu", ranks=list(range(dist.get_world_size())))
    torch.manual_seed(dist.get_rank())  # each rank inits differently: B takes rank 0
    model = gt.to_global(ToyModel(), placement, gt.sbp.broadcast)
    data = _data(
        STEPS, lambda *s: gt.randn(*s, placement=placement, sbp=gt.sbp.split(0))
    )
    losses = _train(model, data, opt)
    torch.manual_seed(0)
    ref = ToyModel()
    want = _train(ref, _data(STEPS, torch.randn), opt)
    same = all(
        torch.allclose(p.full_tensor(), q, atol=1e-6)
        for p, q in zip(model.parameters(), ref.parameters(), strict=True)
    )
    return losses, want, same


def test_data_parallel_sgd_equals_one_process() -> None:
    for losses, want, same in spawn(_data_parallel, 2, "sgd", timeout=30):
        assert same and _close(losses, want) and losses[-1] < losses[0]


def test_data_parallel_adam_equals_one_process_on_4_ranks() -> None:
    for losses, want, same in spawn(_data_parallel, 4, "adam", timeout=30):
        assert same and _close(losses, want)


class ModelParallelLinear(nn.Module):
    """OneFlow's model-parallel example: each rank holds out // n rows of W."""

    def __init__(self, in_features: int, out_features: int, placement: object) -> None:
        super().__init__()
        n = len(placement.ranks)
        self.linear = nn.Linear(in_features, out_features // n)
        gt.to_global(self.linear, placement, gt.sbp.split(0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


def _model_parallel() -> tuple[list, list]:
    n = dist.get_world_size()
    placement = gt.placement("cpu", ranks=list(range(n)))
    torch.manual_seed(10 + dist.get_rank())
    model = ModelParallelLinear(10, 8, placement)
    torch.manual_seed(0)
    data = [
        (
            gt.randn(20, 10, placement=placement, sbp=gt.sbp.broadcast),
            gt.randn(20, 8, placement=placement, sbp=gt.sbp.broadcast),
        )
        for _ in range(STEPS)
    ]
    losses = _train(model, data)
    ref = nn.Linear(10, 8)
    with torch.no_grad():  # the logical weight: every rank's rows, in rank order
        for r in range(n):
            torch.manual_seed(10 + r)
            piece = nn.Linear(10, 8 // n)
            ref.weight[r * 8 // n : (r + 1) * 8 // n] = piece.weight
            ref.bias[r * 8 // n : (r + 1) * 8 // n] = piece.bias
    torch.manual_seed(0)
    plain = [(torch.randn(20, 10), torch.randn(20, 8)) for _ in range(STEPS)]
    return losses, _train(ref, plain)


def test_model_parallel_equals_one_process() -> None:
    for losses, want in spawn(_model_parallel, 2, timeout=30):
        assert _close(losses, want)


def _dtensor() -> dict[str, bool | float]:
    from torch.distributed.tensor import (
        Replicate,
        Shard,
        distribute_tensor,
        init_device_mesh,
    )

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    p = gt.placement("cpu", ranks=list(range(dist.get_world_size())))
    torch.manual_seed(0)
    a, b = torch.randn(6, 4), torch.randn(4, 3)
    out = {}
    for name, (sa, sb, da, db) in {
        "S0 x B": (gt.sbp.split(0), gt.sbp.broadcast, Shard(0), Replicate()),
        "B x S1": (gt.sbp.broadcast, gt.sbp.split(1), Replicate(), Shard(1)),
        "S1 x S0": (gt.sbp.split(1), gt.sbp.split(0), Shard(1), Shard(0)),
    }.items():
        whole = [gt.to_global(t, p, gt.sbp.broadcast) for t in (a, b)]
        ours = torch.mm(whole[0].to_global(sbp=sa), whole[1].to_global(sbp=sb))
        theirs = torch.mm(
            distribute_tensor(a, mesh, [da]), distribute_tensor(b, mesh, [db])
        )
        same_local = torch.allclose(ours.local_tensor, theirs.to_local(), atol=1e-6)
        out[name] = same_local and torch.allclose(
            ours.full_tensor(), theirs.full_tensor(), atol=1e-6
        )
    # the mean over a split batch: ours matches one process
    x, y = torch.randn(8, 3), torch.randn(8, 3)
    xr = x.clone().requires_grad_()
    nn.functional.mse_loss(xr, y).backward()
    xg = gt.to_global(x, p, gt.sbp.broadcast).to_global(sbp=gt.sbp.split(0))
    xg = xg.detach().requires_grad_()
    yg = gt.to_global(y, p, gt.sbp.broadcast).to_global(sbp=gt.sbp.split(0))
    nn.functional.mse_loss(xg, yg).backward()
    out["mse grad"] = torch.allclose(xg.grad.full_tensor(), xr.grad, atol=1e-6)
    xd = distribute_tensor(x, mesh, [Shard(0)]).requires_grad_()
    nn.functional.mse_loss(xd, distribute_tensor(y, mesh, [Shard(0)])).backward()
    ratio = (xd.grad.full_tensor() / xr.grad).mean().item()
    out["dtensor mse grad ratio"] = round(ratio, 3)
    return out


def test_dtensor_gives_the_same_values_for_the_same_layouts() -> None:
    for got in spawn(_dtensor, 2, timeout=60):
        assert all(v is True for k, v in got.items() if k != "dtensor mse grad ratio")
        assert got["dtensor mse grad ratio"] in (1.0, 2.0)  # 2.0: torch's bug


def _two_d() -> tuple[list, list]:
    """DP x TP on a 2 x 2 placement: data (S(0), B); the first Linear's weight
    (out, in) is (B, S(0)) (column parallel), the second's (B, S(1)) (row)."""
    p = gt.placement("cpu", ranks=[[0, 1], [2, 3]])
    b, s0, s1 = gt.sbp.broadcast, gt.sbp.split(0), gt.sbp.split(1)
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 4))
    model = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 4))
    model.load_state_dict(ref.state_dict())
    for layer, sig, bias in [(model[0], (b, s0), (b, s0)), (model[2], (b, s1), (b, b))]:
        for name, t, s in [("weight", layer.weight, sig), ("bias", layer.bias, bias)]:
            whole = gt.to_global(t.detach(), p, (b, b)).to_global(sbp=s)
            layer.register_parameter(name, nn.Parameter(whole))
            gt.create.watch_grad(getattr(layer, name))
    torch.manual_seed(1)
    plain = [(torch.randn(6, 4), torch.randn(6, 4)) for _ in range(5)]
    data = [
        tuple(gt.to_global(t, p, (b, b)).to_global(sbp=(s0, b)) for t in pair)
        for pair in plain
    ]
    return _train(model, data), _train(ref, plain)


def test_dp_x_tp_on_a_2d_placement_equals_one_process() -> None:
    for losses, want in spawn(_two_d, 4, timeout=60):
        assert _close(losses, want)


def _uneven_grad_sbp() -> list[str]:
    """A (1, 4) tensor broadcast to 2 ranks: under grad_sbp=S(0) coordinate 0's piece
    is (1, 4) as its own, coordinate 1's (0, 4): a check of this rank's piece only
    would pass on rank 0 (which would then wait in the backward) and fail on rank 1.
    Both conversions of a local tensor must refuse on both ranks."""
    p = gt.placement("cpu", ranks=[0, 1])
    b, s0 = gt.sbp.broadcast, gt.sbp.split(0)
    x = gt.to_global(torch.ones(1, 4), p, b).requires_grad_()
    return checks.outcomes(
        {
            "to_local": lambda: x.to_local(grad_sbp=s0),
            "to_global": lambda: gt.to_global(torch.ones(1, 4), p, b, grad_sbp=s0),
        }
    )


def test_a_grad_sbp_that_fits_only_some_pieces_fails_on_every_rank() -> None:
    results = spawn(_uneven_grad_sbp, 2, timeout=10)
    assert results[0] == results[1]
    assert results[0][0] == (
        "to_local: to_local: grad_sbp S(0) does not fit a piece of B (shape [1, 4]; "
        "at mesh coordinate [1] a piece [0, 4], not [1, 4])"
    )
    assert results[0][1].startswith("to_global: gt.to_global: grad_sbp S(0) does not")
