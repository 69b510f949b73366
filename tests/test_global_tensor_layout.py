"""layout.place: a layout by parameter name; the two-layer model trained data
parallel, model parallel and 2-D equals one process, and every gradient has its
parameter's signature."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import distcourse.global_tensor as gt
from distcourse.launch import spawn

S0, S1 = gt.sbp.split(0), gt.sbp.split(1)
B = gt.sbp.broadcast
COLUMN_ROW = {"0.weight": S0, "0.bias": S0, "2.weight": S1}
LAYOUTS = {  # name: (placement ranks, data signature, parameter plan)
    "data parallel": ([0, 1, 2, 3], S0, {}),
    "model parallel": ([0, 1, 2, 3], B, COLUMN_ROW),
    "2-D": ([[0, 1], [2, 3]], (S0, B), {k: (B, v) for k, v in COLUMN_ROW.items()}),
}


def _train(name: str) -> tuple[list, list, dict, dict, float]:
    ranks, data_sig, plan = LAYOUTS[name]
    p = gt.placement("cpu", ranks=ranks)
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(10, 8), nn.ReLU(), nn.Linear(8, 5))
    model = gt.layout.place(copy.deepcopy(ref), p, plan)
    b = (B,) * p.ndim
    losses, want, worst = [], [], 0.0
    for m, out in ((model, losses), (ref, want)):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        torch.manual_seed(1)
        for _ in range(3):
            x, y = torch.randn(8, 10), torch.randn(8, 5)
            if m is model:
                x, y = (gt.to_global(t, p, b).to_global(sbp=data_sig) for t in (x, y))
            loss = nn.functional.mse_loss(m(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            out.append(loss.item())
    for q, r in zip(model.parameters(), ref.parameters(), strict=True):
        worst = max(worst, (q.grad.full_tensor() - r.grad).abs().max().item())
    grads = {n: q.grad.sbp for n, q in model.named_parameters()}
    return losses, want, gt.layout.signatures(model), grads, worst


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layouts_train_as_one_process(name: str) -> None:
    for losses, want, sigs, grads, worst in spawn(_train, 4, name, timeout=60):
        assert all(abs(a - b) <= 1e-5 for a, b in zip(losses, want, strict=True))
        assert worst <= 1e-5
        assert {n: gt.sbp.describe(s) for n, s in grads.items()} == sigs
        assert sigs["0.weight"] != "B" or name == "data parallel"


def _unknown() -> str:
    p = gt.placement("cpu", ranks=[0, 1])
    try:
        gt.layout.place(nn.Linear(2, 2), p, {"weigth": S0})
    except ValueError as err:
        return str(err)
    return "no error"


def test_a_misspelt_name_is_refused() -> None:
    assert all("no parameter named ['weigth']" in e for e in spawn(_unknown, 2))
