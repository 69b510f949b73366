"""Each conversion forward and backward (duality.py), on real gloo ranks.

Every (conversion, grad_sbp) pair on a 1-D placement of 4 ranks and many on 2 x 2:
the gradient leaves with the grad_sbp asked for (or the input's signature with P
replaced by B), equals the incoming one, and the bytes the backward sent equal the
boxing formula. A broadcast model's gradient all-reduces send exactly the bytes of
our DDP step on the same model; Megatron's f and g cost one all_reduce each, on
the side the book says.
"""

from __future__ import annotations

import itertools

import torch
import torch.distributed as dist
from spawned import on_ranks
from torch import nn

import distcourse.global_tensor as gt
from distcourse.comm.ledger import Ledger
from distcourse.global_tensor import duality
from distcourse.global_tensor.boxing import steps, transfer_bytes
from distcourse.global_tensor.sbp import local_shape, signature
from distcourse.global_tensor.tensor import default_grad_sbp
from distcourse.launch import spawn
from distcourse.parallel.ddp import DDP

S0, S1 = gt.sbp.split(0), gt.sbp.split(1)
B, P = gt.sbp.broadcast, gt.sbp.partial_sum
SHAPE = (8, 6)


def _formula(src: tuple, dst: tuple, p: gt.Placement) -> int:
    """Rank 0's bytes for boxing src -> dst, step by step (chapter 6's formula)."""
    total = 0
    for k, before, after in steps(src, dst):
        held = local_shape(
            SHAPE, before[:k] + (B,) + before[k + 1 :], p.hierarchy, (0,) * p.ndim
        )
        total += transfer_bytes(before[k], after[k], held, p.hierarchy[k], 4)
    return total


def _pairs(ranks: list, sigs: list, grads: list) -> list[str]:
    p = gt.placement("cpu", ranks=ranks)
    bad = []
    for src, dst, grad in itertools.product(sigs, sigs, grads):
        cost = duality.conversion_cost(p, SHAPE, src, dst, grad_sbp=grad)
        s, d = signature(src, p.ndim, 2, "s"), signature(dst, p.ndim, 2, "d")
        g = default_grad_sbp(s) if grad is None else signature(grad, p.ndim, 2, "g")
        case = f"{cost.src} -> {cost.dst}, grad_sbp {grad}"
        if not cost.correct:
            bad.append(f"{case}: gradient")
        if dist.get_rank() == 0:
            if cost.forward_bytes != _formula(s, d, p):
                bad.append(f"{case}: forward {cost.forward_bytes} B")
            if cost.backward_bytes != _formula(duality.arrives_as(d), g, p):
                bad.append(f"{case}: backward {cost.backward_bytes} B")
    return bad


def _gradients_arrive_partial() -> list[str]:
    """A broadcast output's gradient arriving P: S -> B's backward reduce-scatters."""
    p = gt.placement("cpu", ranks=[0, 1, 2, 3])
    rows = duality.conversion_table(
        p, SHAPE, [(S0, B, P), (S0, B, B), (B, S0, None, P)]
    )
    return [f"{c.backward} {c.backward_bytes} {c.correct}" for c in rows]


def _all_pairs() -> dict[str, list]:
    one_d = [S0, S1, B, P]
    two_d = [(S0, S1), (B, S0), (P, B), (S1, P), (B, B)]
    return {
        "1-D": _pairs([0, 1, 2, 3], one_d, [None, *one_d]),
        "2-D": _pairs([[0, 1], [2, 3]], two_d, [None, (B, B), (S0, S1), (P, P)]),
        "arrive P": _gradients_arrive_partial(),
    }


pairs = on_ranks(_all_pairs, 4, timeout=60, deadline=300)


def test_every_conversion_and_grad_sbp_on_1d(pairs: list[dict]) -> None:
    assert [r["1-D"] for r in pairs] == [[]] * 4


def test_conversions_and_grad_sbps_on_2d(pairs: list[dict]) -> None:
    assert [r["2-D"] for r in pairs] == [[]] * 4


def test_a_partial_gradient_is_reduce_scattered_a_broadcast_one_sliced(
    pairs: list[dict],
) -> None:
    rows = pairs[0]["arrive P"]
    assert rows == ["reduce_scatter 144 True", "slice 0 True", "place in zeros 0 True"]


# ----------------------------------------------- DDP, Megatron's f and g ----


class Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net1, self.net2 = nn.Linear(10, 10), nn.Linear(10, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net2(torch.relu(self.net1(x)))


def _ddp_vs_global() -> tuple[int, int, list, bool]:
    p = gt.placement("cpu", ranks=list(range(dist.get_world_size())))
    torch.manual_seed(0)
    plain, x, y = Toy(), torch.randn(16, 10), torch.randn(16, 5)
    ddp = DDP(Toy(), init_sync=False)
    ddp.module.load_state_dict(plain.state_dict())
    mine = slice(4 * dist.get_rank(), 4 * dist.get_rank() + 4)
    with Ledger() as theirs:
        nn.functional.mse_loss(ddp(x[mine]), y[mine]).backward()
    model = gt.to_global(plain, p, B)
    xg, yg = (gt.to_global(t, p, B).to_global(sbp=S0) for t in (x, y))
    loss = nn.functional.mse_loss(model(xg), yg)
    with Ledger() as ours:
        loss.backward()
    same = all(
        torch.allclose(a.grad.full_tensor(), b.grad, atol=1e-6)
        for a, b in zip(model.parameters(), ddp.module.parameters(), strict=True)
    )
    sigs = duality.gradient_signatures(model)
    return ours.bytes_sent("all_reduce"), theirs.bytes_sent("all_reduce"), sigs, same


def test_broadcast_parameters_all_reduce_the_bytes_of_a_ddp_step() -> None:
    for ours, theirs, sigs, same in spawn(_ddp_vs_global, 4, timeout=60):
        model = 4 * (10 * 10 + 10 + 5 * 10 + 5)  # bytes of every gradient
        assert same and ours == theirs == 2 * 3 * model // 4  # 2(n-1)T/n each
        names = ("net1.weight", "net1.bias", "net2.weight", "net2.bias")
        assert sigs == [(n, "B", "B") for n in names]


def _f_and_g() -> dict[str, int | bool]:
    """A column- then row-parallel pair (Megatron's MLP) with f and g written out."""
    p = gt.placement("cpu", ranks=[0, 1])
    torch.manual_seed(0)
    a, b, x = torch.randn(6, 4), torch.randn(4, 6), torch.randn(3, 4)
    ref_x = x.clone().requires_grad_()
    (torch.relu(ref_x @ a.t()) @ b.t()).sum().backward()
    w1 = gt.to_global(a, p, B).to_global(sbp=S0).requires_grad_()  # column
    w2 = gt.to_global(b, p, B).to_global(sbp=S1).requires_grad_()  # row
    xg = gt.to_global(x, p, B).requires_grad_()
    out: dict[str, int | bool] = {}
    with Ledger() as fwd:
        h = duality.copy_to_parallel(xg)  # f
        y = duality.reduce_from_parallel(torch.relu(h @ w1.t()) @ w2.t())  # g
    loss = y.sum()
    with Ledger() as bwd, gt.debug() as log:
        loss.backward()
    out["forward"] = fwd.bytes_sent("all_reduce")
    out["backward"] = bwd.bytes_sent("all_reduce")
    out["y"] = y.sbp == (B,)
    out["same"] = torch.allclose(xg.grad.full_tensor(), ref_x.grad, atol=1e-5)
    out["boxed in backward"] = sum("all_reduce" in ln for ln in log.backward())
    return out


def test_megatron_f_and_g_are_one_all_reduce_each() -> None:
    got = spawn(_f_and_g, 2, timeout=30)[0]
    # g: forward all_reduce of y (3 x 4); f: backward all_reduce of dx (3 x 4)
    assert got == {
        "forward": 48,
        "backward": 48,
        "y": True,
        "same": True,
        "boxed in backward": 1,
    }


def _debug_select() -> list[str]:
    p = gt.placement("cpu", ranks=[0, 1])
    x = gt.randn(4, 6, placement=p, sbp=S0)
    w = gt.randn(6, 2, placement=p, sbp=B, requires_grad=True)
    with gt.debug() as log:
        (x @ w).sum().backward()
    return log.select("mm")


def test_the_debug_view_shows_the_backward_matmul_and_the_leaf_all_reduce() -> None:
    lines = spawn(_debug_select, 2, timeout=30)[0]
    assert lines[0] == "aten.mm  S(1) x B -> P"  # dw = x^T dy: dy B sliced to S(0)
    assert lines[1:3] == ["  box arg 1: B -> S(0)", "    mesh dim 0: B -> S(0)  slice"]
    assert lines[3:] == [
        "  gradient into a leaf: P -> B",
        "    mesh dim 0: P -> B  all_reduce",
    ]


def _from_local() -> dict[str, object]:
    """gt.to_global(local, p, B, grad_sbp=P): DTensor's from_local(...,
    grad_placements=[Partial()]); each rank's local gradient is a part."""
    p = gt.placement("cpu", ranks=[0, 1])
    c = gt.to_global(torch.arange(8.0).reshape(4, 2), p, B).to_global(sbp=S0)
    out: dict[str, object] = {}
    for name, grad in (("default", None), ("P", P)):
        x = torch.ones(4, 2, requires_grad=True)
        loss = (gt.to_global(x, p, B, grad_sbp=grad) * c).sum()
        with Ledger() as ledger:  # the backward only
            loss.backward()
        summed = x.grad.clone()
        dist.all_reduce(summed)
        whole = torch.arange(8.0).reshape(4, 2)
        out[name] = (
            ledger.bytes_sent("all_gather") > 0,
            torch.equal(x.grad, whole),
            torch.equal(summed, whole),
        )
    try:
        gt.to_global(torch.ones(2, 2), p, S0, grad_sbp=B)
    except ValueError as err:
        out["error"] = str(err)
    return out


def test_to_global_of_a_local_tensor_takes_grad_sbp() -> None:
    for got in spawn(_from_local, 2, timeout=30):
        assert got["default"] == (True, True, False)  # all_gathered: whole everywhere
        assert got["P"] == (False, False, True)  # no message: parts that sum
        assert got["error"] == (
            "gt.to_global: grad_sbp B does not fit a piece of S(0) (shape [4, 2]; at "
            "mesh coordinate [0] a piece [4, 2], not [2, 2])"
        )
