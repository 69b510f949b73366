"""ZB-H1: the backward split into B (input gradient) and W (weight gradients) gives
one backward's gradients, W's work is not done twice, and the schedule's action
lists, memory and bubble on paper are what the paper says."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from distcourse.parallel import pipeline as pp
from distcourse.parallel.pipeline import schedules as S


def _stage() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 4), nn.LayerNorm(4))


def _grads(stage: nn.Module, split: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(3, 6, generator=gen, requires_grad=True)
    dy = torch.randn(3, 4, generator=gen)
    out = stage(x)
    if split:
        weight = pp.backward_input(out, dy, x, list(stage.parameters()))
        assert all(p.grad is None for p in stage.parameters())  # B left them to W
        weight()
    else:
        out.backward(dy)
    return x.grad, [p.grad for p in stage.parameters()]


def test_b_then_w_equals_one_backward() -> None:
    x_split, w_split = _grads(_stage(), split=True)
    x_full, w_full = _grads(_stage(), split=False)
    assert torch.equal(x_split, x_full)
    for a, b in zip(w_split, w_full, strict=True):
        assert torch.allclose(a, b, atol=1e-7, rtol=0)


class Counted(torch.autograd.Function):
    """x * w, counting how often its backward runs."""

    calls = 0

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        ctx.save_for_backward(x, w)
        return x * w

    @staticmethod
    def backward(ctx, g: torch.Tensor) -> tuple:  # noqa: ANN001
        Counted.calls += 1
        x, w = ctx.saved_tensors
        gx = g * w if ctx.needs_input_grad[0] else None
        gw = (g * x).sum(0) if ctx.needs_input_grad[1] else None
        return gx, gw


def test_w_restarts_where_b_stopped() -> None:
    """B runs each node once for the input; W runs only the nodes that lead to a
    weight, from the gradients B caught (here the one node, once more, for w)."""
    w = nn.Parameter(torch.full((4,), 2.0))
    x = torch.ones(3, 4, requires_grad=True)
    Counted.calls = 0
    weight = pp.backward_input(Counted.apply(x, w).tanh().sum(), None, x, [w])
    assert Counted.calls == 1 and w.grad is None
    weight()
    assert Counted.calls == 2
    want = torch.autograd.grad((x.detach() * w).tanh().sum(), w)[0]
    assert torch.allclose(w.grad, want)


def test_a_shared_weight_or_no_input_gradient_runs_the_whole_backward_in_b() -> None:
    lin = nn.Linear(4, 4)
    x = torch.ones(2, 4, requires_grad=True)
    weight = pp.backward_input(lin(lin(x)).sum(), None, x, list(lin.parameters()))
    assert lin.weight.grad is not None and x.grad is not None  # all done in B
    weight()  # nothing left
    first = nn.Linear(4, 4)
    weight = pp.backward_input(
        first(torch.ones(2, 4)).sum(), None, torch.ones(2, 4), list(first.parameters())
    )
    assert first.weight.grad is not None


@pytest.mark.parametrize("p, m", [(2, 2), (2, 5), (4, 4), (4, 8), (3, 7)])
def test_zb_h1_lists_memory_and_bubble_on_paper(p: int, m: int) -> None:
    s = pp.zb_h1(p, m)
    S.check(s)  # each F, B and W once; F before B before W; transfers in order
    assert all(len(acts) == 3 * m for acts in s.actions)
    assert S.in_flight(s) == [p] * p  # 1F1B's peak (rank 0's), on every rank
    assert set(S.transfers(s)) == set(S.transfers(S.one_f_one_b(p, m)))  # no W sent

    def bubble(schedule: S.Schedule) -> float:
        ran = S.simulate(schedule, forward=1.0, backward=2.0)  # B = W = F
        return pp.bubble([[(str(a), t0, t1) for a, t0, t1 in acts] for acts in ran])

    assert bubble(s) == pytest.approx(pp.zb_h1_bubble(p, m))  # (p-1) / (3m + p-1)
    assert bubble(S.one_f_one_b(p, m)) == pytest.approx(pp.bubble_formula(p, m))
    assert pp.zb_h1_bubble(p, m) < pp.bubble_formula(p, m)


def test_zb_h1_order_and_refusals() -> None:
    assert pp.zb_h1(2, 3).show() == (
        "rank 0: F0.0 F0.1 B0.0 W0.0 F0.2 B0.1 W0.1 B0.2 W0.2\n"
        "rank 1: F1.0 B1.0 F1.1 B1.1 W1.0 F1.2 B1.2 W1.1 W1.2"
    )
    with pytest.raises(ValueError, match="must be a positive integer"):
        pp.zb_h1(0, 4)
    bad = S.Schedule(
        "bad",
        1,
        1,
        1,
        ((S.Action("F", 0, 0), S.Action("W", 0, 0), S.Action("B", 0, 0)),),
    )
    with pytest.raises(ValueError, match=r"runs W0.0 before its input gradient \(B\)"):
        S.check(bad)
