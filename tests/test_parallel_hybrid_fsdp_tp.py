"""FSDP x TP on a 2 x 2 (dp, tp) mesh equals one process.

TP inside (the MLP's first two Linear layers split over tp), FSDP over dp, as
torchtitan composes them. On 4 gloo ranks: the gradients of step 1 (read from plain
SGD's first update, (p0 - p1) / lr) and the parameters after 3 steps of SGD and of
AdamW equal one process trained on both dp groups' rows; gradients summed over dp
instead of averaged fail; each rank holds 1/4 of the split layers.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from distcourse.examples import sharding as ex
from distcourse.launch import spawn
from distcourse.mesh import Mesh
from distcourse.parallel.hybrid.fsdp_tp import full_state_dict, parallelize_mlp

ATOL = 1e-5
DP = 2


def _one_process_gradients() -> dict[str, torch.Tensor]:
    model = ex.uneven_mlp()
    rows = [ex.batch(0, r) for r in range(DP)]
    x, y = (torch.cat(t) for t in zip(*rows, strict=True))
    F.mse_loss(model(x), y).backward()
    return {n: p.grad for n, p in model.named_parameters()}


def _train(mesh: Mesh, kind: str, steps: int, scale: float = 1.0) -> nn.Module:
    model = parallelize_mlp(ex.uneven_mlp(), mesh)
    opt = ex.optimizer(kind, model.parameters())

    def scaled() -> None:
        for p in model.parameters():
            if p.grad is not None:
                p.grad *= scale

    ex.train(model, opt, mesh.coordinate["dp"], steps=steps, before_step=scaled)
    return model


def _on_ranks() -> dict:
    torch.set_num_threads(1)
    mesh = Mesh((DP, 2), ("dp", "tp"))
    out: dict = {}
    start = ex.uneven_mlp().state_dict()
    after1 = full_state_dict(_train(mesh, "SGD", 1), mesh)
    lr = ex.OPTIMIZERS["SGD"][1]["lr"]
    grads = {k: (start[k] - after1[k]) / lr for k in start}
    out["gradients"] = ex.max_difference(grads, _one_process_gradients())
    for kind in ex.OPTIMIZERS:
        model = _train(mesh, kind, 3)
        full = full_state_dict(model, mesh)
        out[kind] = ex.max_difference(full, ex.one_process(DP, kind))
    out["held"] = {n: p.numel() for n, p in model.named_parameters()}
    summed = full_state_dict(_train(mesh, "SGD", 3, scale=DP), mesh)
    out["summed"] = ex.max_difference(summed, ex.one_process(DP, "SGD"))
    return out


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return spawn(_on_ranks, 4, timeout=60)


def test_gradients_of_step_1_are_one_process(results: list[dict]) -> None:
    for r in results:
        assert r["gradients"] <= ATOL, r


@pytest.mark.parametrize("kind", sorted(ex.OPTIMIZERS))
def test_parameters_after_3_steps_are_one_process(
    results: list[dict], kind: str
) -> None:
    for r in results:
        assert r[kind] <= ATOL, r


def test_gradients_summed_over_dp_fail(results: list[dict]) -> None:
    for r in results:
        assert r["summed"] > 100 * ATOL


def test_each_rank_holds_a_quarter_of_the_split_layers(results: list[dict]) -> None:
    # every number of a split layer is held by exactly one of the 4 ranks
    held = [r["held"] for r in results]
    assert sum(h["0.weight"] for h in held) == 10 * 6
    assert sum(h["2.weight"] for h in held) == 7 * 10
    assert max(h["0.weight"] for h in held) == 3 * 6  # 5 rows over dp: 3 and 2
    # the last Linear is whole over tp, so sharded over dp only: twice over
    assert sum(h["4.weight"] for h in held) == 2 * 3 * 7
