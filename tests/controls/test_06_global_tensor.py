"""Negative controls for chapter 6's verdicts: each check the chapter prints, run on
a planted fault, prints FAIL / False.

The faults are what goes wrong with global tensors in practice: replicas out of
sync (a "broadcast" tensor whose copies differ by rank), pieces on the wrong rank,
gradients summed over the ranks instead of averaged, a stale checkpoint, and a
conversion that takes another route than its collective (its bytes then miss the
formula). One spawn of 4 ranks runs them all; rank 0's lines come back.
"""

from __future__ import annotations

import copy
import os
import tempfile

import pytest
import torch
import torch.distributed as dist
from torch import nn

import distcourse.global_tensor as gt
from distcourse import checks
from distcourse.comm.ledger import Ledger
from distcourse.global_tensor.boxing import cost_line
from distcourse.launch import spawn

S0, S1 = gt.sbp.split(0), gt.sbp.split(1)
B, P = gt.sbp.broadcast, gt.sbp.partial_sum


class ToyModel(nn.Module):
    """The chapter's model (step 4)."""

    def __init__(self) -> None:
        super().__init__()
        self.net1, self.relu = nn.Linear(10, 10), nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net2(self.relu(self.net1(x)))


def _out_of_sync(whole: torch.Tensor, pl: gt.Placement) -> gt.GlobalTensor:
    """A 'broadcast' tensor whose copy on rank r is off by r + 1: replicas that
    drifted apart."""
    sig = (B,) * pl.ndim
    mine = whole + dist.get_rank() + 1
    return gt.GlobalTensor(mine, pl, sig, tuple(whole.shape))


def _summed_over_ranks(model: nn.Module) -> nn.Module:
    """Every gradient x 4 after it is boxed: summed over the ranks, not averaged."""
    for q in model.parameters():
        q.register_hook(lambda g: g * dist.get_world_size())
    return model


def _train(model: nn.Module, make, out: int = 5, steps: int = 3) -> list[float]:
    """The chapter's single-device loop (fewer steps)."""
    loss_fn = nn.MSELoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    torch.manual_seed(1)
    losses = []
    for _ in range(steps):
        x, y = make(20, 10), make(20, out)
        loss = loss_fn(model(x), y)
        opt.zero_grad(), loss.backward(), opt.step()
        losses.append(loss.item())
    return losses


def _pieces(p1: gt.Placement, p2: gt.Placement) -> list[str]:
    """Steps 2's check, `full_tensor() == whole`, on replicas out of sync."""
    whole = torch.arange(16.0).reshape(4, 4)
    lines = []
    for pl, sigs in ((p1, [(S0,), (S1,), (B,), (P,)]), (p2, [(S0, S1), (P, S1)])):
        x = _out_of_sync(whole, pl)
        for sig in sigs:
            y = x.to_global(sbp=sig)
            same = torch.equal(y.full_tensor(), whole)
            lines.append(f"{sig}: full_tensor() == whole: {same}")
    return lines


def _routes(p1: gt.Placement) -> list[str]:
    """Step 3's cost_line on each conversion done by another route."""
    t = gt.randn(8, 8, placement=p1, sbp=B)
    routes = [  # (src, dst, the roundabout route's signatures)
        (S0, B, [P, B]),  # place in zeros, then all_reduce
        (P, S0, [B, S0]),  # all_reduce, then slice
        (P, B, [S0, B]),  # reduce_scatter, then all_gather (+ sizes)
        (S0, S1, [B, S1]),  # all_gather, then slice
        (B, S0, [P, S0]),  # zeros, then reduce_scatter
        (B, P, [S0, B, P]),  # slice, all_gather, zeros
        (S0, P, [B, P]),  # all_gather, then zeros
    ]
    lines = []
    for src, dst, via in routes:
        x = t.to_global(sbp=src)
        with Ledger() as ledger:
            for sig in via:
                x = x.to_global(sbp=sig)
        lines.append(cost_line(src, dst, ledger.bytes_sent(), (8, 8), 4, 4))
    return lines


def _training(p1: gt.Placement) -> list[str]:
    """Steps 4, 5 and 7: trained with gradients summed over ranks, checkpoints
    that are stale, against one process and DTensor, as the chapter checks."""
    lines = []
    torch.manual_seed(0)
    dp = _summed_over_ranks(gt.to_global(ToyModel(), p1, B))
    dp_losses = _train(dp, lambda *s: gt.randn(*s, placement=p1, sbp=S0))
    torch.manual_seed(0)
    one = ToyModel()
    one_losses = _train(one, lambda *s: torch.randn(*s))
    d_loss = max(abs(a - b) for a, b in zip(dp_losses, one_losses, strict=True))
    d_par = max(
        (p.full_tensor() - q).abs().max().item()
        for p, q in zip(dp.parameters(), one.parameters(), strict=True)
    )
    lines.append(f"losses vs one process {checks.verdict(d_loss, 1e-5)}")
    lines.append(f"parameters vs one process {checks.verdict(d_par, 1e-5)}")

    path = f"{tempfile.gettempdir()}/distcourse_ch6_control_{os.getppid()}.pt"
    torch.manual_seed(0)
    trained = gt.to_global(ToyModel(), p1, B)
    gt.save(trained.state_dict(), path, global_dst_rank=0)  # saved before training
    _train(trained, lambda *s: gt.randn(*s, placement=p1, sbp=S0), steps=1)
    torch.manual_seed(5)
    fresh = gt.to_global(ToyModel(), p1, B)
    fresh.load_state_dict(gt.load(path, global_src_rank=0))  # the stale file
    dist.barrier()  # read: rank 0 removes it (nothing of a run stays behind)
    if dist.get_rank() == 0:
        os.remove(path)
    x = gt.randn(8, 10, placement=p1, sbp=S0)
    d = (fresh(x).full_tensor() - trained(x).full_tensor()).abs().max().item()
    lines.append(f"loaded model == saved model {checks.verdict(d, 1e-6)}")

    torch.manual_seed(10 + dist.get_rank())
    layer = nn.Linear(10, 2)
    gt.to_global(layer, p1, S0)
    ref = nn.Linear(10, 8)
    ref.load_state_dict({k: v.full_tensor() for k, v in layer.state_dict().items()})
    data = lambda *s: gt.randn(*s, placement=p1, sbp=B)  # noqa: E731
    mp_losses = _train(_summed_over_ranks(layer), data, out=8)
    ref_losses = _train(ref, lambda *s: torch.randn(*s), out=8)
    d = max(abs(a - b) for a, b in zip(mp_losses, ref_losses, strict=True))
    lines.append(f"losses; vs one process {checks.verdict(d, 1e-5)}")
    return lines


def _matmuls(p1: gt.Placement) -> list[str]:
    """Step 6's check of each matmul rule, with replicas out of sync."""
    torch.manual_seed(0)
    a, b = torch.randn(8, 4), torch.randn(4, 6)
    ga, gb = _out_of_sync(a, p1), _out_of_sync(b, p1)
    lines = []
    for sa, sb in ((S0, B), (B, S1), (S1, S0), (P, B), (B, P), (B, B)):
        y = torch.mm(ga.to_global(sbp=sa), gb.to_global(sbp=sb))
        d = checks.max_over_ranks((y.full_tensor() - a @ b).abs().max().item())
        rule = f"{sa!r} x {sb!r} -> {y.sbp[0]!r}"
        lines.append(f"{rule}: vs one process {checks.verdict(d, 1e-5)}")
    return lines


def _dtensor(p1: gt.Placement) -> list[str]:
    """Step 7's comparisons with DTensor, ours faulty: pieces out of sync, partial
    parts off by one, gradients summed over ranks."""
    from torch.distributed.tensor import (
        DTensor,
        Partial,
        Replicate,
        Shard,
        distribute_module,
        distribute_tensor,
        init_device_mesh,
    )

    mesh = init_device_mesh("cpu", (4,))
    lines = []
    whole = torch.arange(48.0).reshape(8, 6)
    ours = _out_of_sync(whole, p1)
    for s, d in ((S0, Shard(0)), (B, Replicate())):
        a = ours.to_global(sbp=s).to_local()
        b = distribute_tensor(whole, mesh, [d]).to_local()
        same = a.shape == b.shape and torch.equal(a, b)
        lines.append(f"{s!r}: ours {tuple(a.shape)}, same: {same}")

    pairs = {S0: Shard(0), S1: Shard(1), B: Replicate(), P: Partial()}
    part = torch.arange(64.0).reshape(8, 8) * (dist.get_rank() + 1) / 10
    for src, dst in ((S0, B), (P, B), (P, S0), (S0, S1), (B, S0)):
        x = gt.to_global(part + 1, p1, P).to_global(sbp=src)  # parts off by one
        xd = DTensor.from_local(part, mesh, [Partial()]).redistribute(
            mesh, [pairs[src]]
        )
        ours_piece = x.to_global(sbp=dst).to_local()
        theirs_piece = xd.redistribute(mesh, [pairs[dst]]).to_local()
        diff = (ours_piece - theirs_piece).abs().max().item()
        lines.append(f"{src!r} -> {dst!r}: same pieces {checks.verdict(diff, 1e-5)}")

    torch.manual_seed(0)
    plain = ToyModel()
    mine = _summed_over_ranks(gt.to_global(copy.deepcopy(plain), p1, B))
    theirs = distribute_module(plain, mesh)
    x = torch.randn(20, 10)
    mine(gt.to_global(x, p1, B).to_global(sbp=S0)).sum().backward()
    theirs(distribute_tensor(x, mesh, [Shard(0)])).sum().backward()
    for q in theirs.parameters():
        q.grad = q.grad.redistribute(mesh, [Replicate()])
    d = max(
        (p.grad.full_tensor() - q.grad.full_tensor()).abs().max().item()
        for p, q in zip(mine.parameters(), theirs.parameters(), strict=True)
    )
    lines.append(f"gradients: ours vs DTensor {checks.verdict(d, 1e-5)}")
    return lines


def _faults() -> dict[str, list[str]]:
    torch.set_num_threads(1)
    p1 = gt.placement("cpu", ranks=[0, 1, 2, 3])
    p2 = gt.placement("cpu", ranks=[[0, 1], [2, 3]])
    return {
        "pieces": _pieces(p1, p2),
        "routes": _routes(p1),
        "training": _training(p1),
        "matmuls": _matmuls(p1),
        "dtensor": _dtensor(p1),
    }


@pytest.fixture(scope="module")
def lines() -> dict[str, list[str]]:
    """Every rank's lines for every fault (one spawn for the whole file)."""
    return spawn(_faults, 4, timeout=120)


@pytest.mark.controls(
    "06_global_tensor",
    r"full_tensor\(\) == whole: True",
    fault="replicas out of sync: rank r's copy of the broadcast tensor is off by r+1",
)
def test_full_tensor_of_replicas_out_of_sync_is_not_the_tensor(lines: list) -> None:
    assert all(ln.endswith(": False") for ln in lines[0]["pieces"])


@pytest.mark.controls(
    "06_global_tensor",
    r"ledger +\d+ B, formula +\d+ B PASS",
    fault="each conversion done by another route (P -> S as all_reduce + slice, ...)",
)
def test_a_conversion_by_another_route_misses_the_formula(lines: list) -> None:
    got = lines[0]["routes"]
    assert len(got) == 7 and all(ln.endswith("FAIL") for ln in got), got


@pytest.mark.controls(
    "06_global_tensor",
    r"losses vs one process|parameters vs one process",
    fault="data parallel with every gradient summed over the 4 ranks, not averaged",
)
@pytest.mark.controls(
    "06_global_tensor",
    r"loaded model == saved model",
    fault="a stale checkpoint: the file was saved before the model trained",
)
@pytest.mark.controls(
    "06_global_tensor",
    r"losses [\d.]+ -> [\d.]+; vs one process",
    fault="model parallel with every gradient summed over the 4 ranks",
)
def test_training_and_checkpoint_faults_fail(lines: list) -> None:
    for rank_lines in lines:
        got = rank_lines["training"]
        assert len(got) == 4 and all(ln.endswith("FAIL") for ln in got), got


@pytest.mark.controls(
    "06_global_tensor",
    r"-> \S+: vs one process <= 1e-05: PASS",
    fault="replicas out of sync: each rank's copy of A and B is off by its rank + 1",
)
def test_matmul_rules_on_replicas_out_of_sync_fail(lines: list) -> None:
    got = lines[0]["matmuls"]
    assert len(got) == 6 and all(ln.endswith("FAIL") for ln in got), got


@pytest.mark.controls(
    "06_global_tensor",
    r"ours \(\d+, \d+\), DTensor \(\d+, \d+\), same: True",
    fault="our replicas out of sync with the tensor DTensor cuts",
)
@pytest.mark.controls(
    "06_global_tensor",
    r"same pieces <= 1e-05: PASS",
    fault="our partial parts off by one on every rank",
)
@pytest.mark.controls(
    "06_global_tensor",
    r"gradients: ours vs DTensor",
    fault="our gradients summed over the 4 ranks, not averaged",
)
def test_dtensor_comparisons_of_faulty_ours_fail(lines: list) -> None:
    for rank_lines in lines:
        got = rank_lines["dtensor"]
        assert got[:2] == [
            "S(0): ours (2, 6), same: False",
            "B: ours (8, 6), same: False",
        ]
        assert all(ln.endswith("FAIL") for ln in got[2:]), got
