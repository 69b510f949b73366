"""SBP rules (rules.py, reductions.py) on real gloo ranks: each op's value and each
input's gradient equal one process running it on whole tensors, and the output
takes the signature OneFlow's table gives. Uneven sizes (5 rows on 2 ranks) make a
mean of local means wrong, so the mean rules are really tested.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from helpers import ints, linear
from torch import Tensor

import distcourse.global_tensor as gt
from distcourse.global_tensor.sbp import local_piece
from distcourse.launch import spawn

S0, S1 = gt.sbp.split(0), gt.sbp.split(1)
B, P = gt.sbp.broadcast, gt.sbp.partial_sum


def _ce(x: Tensor, t: Tensor) -> Tensor:
    return F.cross_entropy(x, t.long(), ignore_index=1)


# name: (fn, input shapes, input signatures (1-D or 2-D), output signature)
CASES: dict[str, tuple[Callable, list, list, object]] = {
    "mm S0 x B": (torch.mm, [(5, 4), (4, 3)], [S0, B], S0),
    "mm B x S1": (torch.mm, [(5, 4), (4, 3)], [B, S1], S1),
    "mm S1 x S0": (torch.mm, [(5, 4), (4, 3)], [S1, S0], P),
    "mm P x B": (torch.mm, [(5, 4), (4, 3)], [P, B], P),
    "mm B x P": (torch.mm, [(5, 4), (4, 3)], [B, P], P),
    "mm B x B": (torch.mm, [(5, 4), (4, 3)], [B, B], B),
    "mm S0 x S1 (boxes)": (torch.mm, [(5, 4), (4, 3)], [S0, S1], S0),
    "linear, data parallel": (linear, [(5, 4), (3, 4), (3,)], [S0, B, B], S0),
    "linear, column parallel": (linear, [(5, 4), (3, 4), (3,)], [B, S0, S0], S1),
    "linear, row parallel": (linear, [(5, 4), (3, 4), (3,)], [S1, S1, B], P),
    "linear 3-D, batch S0": (linear, [(4, 3, 5), (2, 5), (2,)], [S0, B, B], S0),
    "linear 3-D, uneven batch (boxes)": (
        linear,
        [(3, 4, 5), (2, 5), (2,)],
        [S0, B, B],
        B,
    ),
    "linear 3-D, sequence S1 (boxes)": (
        linear,
        [(4, 3, 5), (2, 5), (2,)],
        [S1, B, B],
        B,
    ),
    "add S0 S0": (torch.add, [(5, 3), (5, 3)], [S0, S0], S0),
    "add S1 + row B": (torch.add, [(5, 3), (3,)], [S1, B], S1),
    "add S0 + row B": (torch.add, [(5, 3), (3,)], [S0, B], S0),
    "add P P": (torch.add, [(5, 3), (5, 3)], [P, P], P),
    "sub P B": (torch.sub, [(5, 3), (5, 3)], [P, B], P),
    "mul P B": (torch.mul, [(5, 3), (5, 3)], [P, B], P),
    "mul B P": (torch.mul, [(5, 3), (5, 3)], [B, P], P),
    "mul P P (boxes)": (torch.mul, [(5, 3), (5, 3)], [P, P], P),
    "div P by B": (lambda a, b: a / (b.abs() + 1), [(5, 3), (5, 3)], [P, B], P),
    "times 2 of P": (lambda a: a * 2, [(5, 3)], [P], P),
    "plus 2 of P (boxes)": (lambda a: a + 2, [(5, 3)], [P], B),
    "relu P (boxes)": (torch.relu, [(5, 3)], [P], B),
    "relu S1": (torch.relu, [(5, 3)], [S1], S1),
    "gelu S0": (F.gelu, [(5, 3)], [S0], S0),
    "sum S0": (torch.sum, [(5, 3)], [S0], P),
    "sum dim 0 of S0": (lambda a: a.sum(0), [(5, 3)], [S0], P),
    "sum dim 1 of S0": (lambda a: a.sum(1), [(5, 3)], [S0], S0),
    "sum dim 0 keepdim of S1": (lambda a: a.sum(0, True), [(5, 3)], [S1], S1),
    "mean S0 (uneven)": (torch.mean, [(5, 3)], [S0], P),
    "mean dim 0 of S0": (lambda a: a.mean(0), [(5, 3)], [S0], P),
    "mean dim 1 of S0": (lambda a: a.mean(1), [(5, 3)], [S0], S0),
    "mean of P": (torch.mean, [(5, 3)], [P], P),
    "mse_loss S0": (F.mse_loss, [(5, 3), (5, 3)], [S0, S0], P),
    "mse_loss sum S0": (
        lambda a, b: F.mse_loss(a, b, reduction="sum"),
        [(5, 3), (5, 3)],
        [S0, S0],
        P,
    ),
    "mse_loss B": (F.mse_loss, [(5, 3), (5, 3)], [B, B], B),
    "cross_entropy S0": (_ce, [(5, 4), (5,)], [S0, S0], P),
    "cross_entropy classes S1 (boxes)": (_ce, [(5, 4), (5,)], [S1, B], B),
    "transpose S0": (lambda a: a.t() * 1, [(5, 3)], [S0], S1),
    "view S0 keeps rows": (lambda a: a.view(5, 3, 1) * 1, [(5, 3)], [S0], S0),
    "view S0 merged (boxes)": (lambda a: a.view(15) * 1, [(5, 3)], [S0], B),
}
CASES_2D: dict[str, tuple[Callable, list, list, object]] = {
    "OneFlow 2-D matmul": (torch.mm, [(4, 5), (5, 6)], [(B, S0), (S1, B)], (S1, S0)),
    "dp x tp column": (
        linear,
        [(6, 4), (5, 4), (5,)],
        [(S0, B), (B, S0), (B, S0)],
        (S0, S1),
    ),
    "dp x tp row": (
        linear,
        [(6, 4), (5, 4), (5,)],
        [(S0, S1), (B, S1), (B, B)],
        (S0, P),
    ),
    "mean (S0, S0)": (torch.mean, [(7, 3)], [(S0, S0)], (P, P)),
    "mse_loss (S0, S1)": (F.mse_loss, [(5, 3), (5, 3)], [(S0, S1), (S0, S1)], (P, P)),
    "cross_entropy (S0, S0)": (_ce, [(9, 4), (9,)], [(S0, S0), (S0, S0)], (P, P)),
}


def _inputs(shapes: list, seed: int) -> list[Tensor]:
    xs = [ints(s, seed + i) for i, s in enumerate(shapes)]
    if len(xs) == 2 and xs[1].dim() == 1 and xs[0].shape[0] == xs[1].shape[0]:
        xs[1] = (xs[1].abs() % xs[0].shape[1]).to(torch.float64)  # class labels
    return xs


def _run(cases: dict, ranks: list) -> list[str]:
    p = gt.placement("cpu", ranks=ranks)
    bad = []
    for name, (fn, shapes, sigs, want) in cases.items():
        wholes = _inputs(shapes, 10)
        grads = name.find("cross_entropy") < 0 or [True, False]
        needs = [True] * len(wholes) if grads is True else grads
        refs = [w.clone().requires_grad_(n) for w, n in zip(wholes, needs, strict=True)]
        ref = fn(*refs)
        weight = ints(tuple(ref.shape), 99)
        (ref * weight).sum().backward()
        xs = []
        for w, s, n in zip(wholes, sigs, needs, strict=True):
            sig = s if isinstance(s, tuple) else (s,)
            piece = local_piece(w, sig, p.hierarchy, p.coord)
            xs.append(gt.to_global(piece, p, sig).detach().requires_grad_(n))
        out = fn(*xs)
        wg = gt.to_global(weight, p, (B,) * p.ndim)
        (out * wg).sum().backward()
        want = want if isinstance(want, tuple) else (want,)
        if out.sbp != want:
            bad.append(f"{name}: sbp {out.sbp}, want {want}")
        if not torch.allclose(out.full_tensor(), ref, atol=1e-12):
            bad.append(f"{name}: value")
        for i, (x, r) in enumerate(zip(xs, refs, strict=True)):
            if r.grad is not None and not torch.allclose(
                x.grad.full_tensor(), r.grad, atol=1e-12
            ):
                bad.append(f"{name}: gradient {i}")
    return bad


@pytest.mark.parametrize("world", [2, 4])
def test_rules_equal_one_process(world: int) -> None:
    assert spawn(_run, world, CASES, list(range(world)), timeout=20) == [[]] * world


def test_rules_on_a_2d_placement_equal_one_process() -> None:
    assert spawn(_run, 4, CASES_2D, [[0, 1], [2, 3]], timeout=20) == [[]] * 4


def _debug() -> list[str]:
    p = gt.placement("cpu", ranks=[0, 1])
    a = gt.randn(4, 6, placement=p, sbp=S1)
    b = gt.randn(6, 2, placement=p, sbp=B)
    with gt.debug() as log:
        torch.mm(a, b).sum().item()
    return log.lines


def test_the_debug_view_shows_ops_signatures_and_boxing() -> None:
    lines = spawn(_debug, 2, timeout=20)[0]
    assert lines[0] == "aten.mm  S(1) x B -> P"
    assert lines[1] == "  box arg 1: B -> S(0)"
    assert "slice" in lines[2]
    assert "aten.sum  P -> P" in lines
    assert any("fallback" in ln for ln in lines)  # .item(): boxed to B, all_reduce
