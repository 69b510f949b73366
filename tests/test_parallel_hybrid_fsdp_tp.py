"""FSDP x TP on a 2 x 2 (dp, tp) mesh equals one process.

TP inside, FSDP over dp, as torchtitan composes them, on two models: an MLP (its
first two Linear layers split over tp) and a TinyGPT (every block's attention and
MLP split by chapter 4's `parallelize_gpt`, the embedding and head by vocabulary;
each block and the root sharded over dp). On 4 gloo ranks: the gradients of step 1
(read from plain SGD's first update, (p0 - p1) / lr) and the parameters after 3
steps of SGD and of AdamW equal one process trained on both dp groups' rows;
gradients summed over dp instead of averaged fail; each rank holds 1/4 of the split
layers.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from spawned import on_ranks
from torch import nn

from distcourse.examples import sharding as ex
from distcourse.mesh import Mesh
from distcourse.parallel.hybrid import fsdp_tp
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
    out.update(_gpt(mesh))
    return out


def _doubled(model: nn.Module) -> None:
    for p in model.parameters():
        p.grad *= DP


def _gpt(mesh: Mesh) -> dict:
    """The same checks on TinyGPT blocks: attention and MLP split over tp."""
    out: dict = {}
    lr = fsdp_tp.OPTIMIZERS["SGD"][1]["lr"]
    after1 = full_state_dict(fsdp_tp.train_gpt(mesh, "SGD", 1), mesh)
    start, ref1 = fsdp_tp.start_gpt(), fsdp_tp.one_process_gpt("SGD", 1)
    ours = {k: (start[k] - after1[k]) / lr for k in start}
    theirs = {k: (start[k] - ref1[k]) / lr for k in start}
    out["gpt gradients"] = fsdp_tp.difference(ours, theirs, "SGD")
    for kind in fsdp_tp.OPTIMIZERS:
        model = fsdp_tp.train_gpt(mesh, kind, 3)
        full = full_state_dict(model, mesh)
        out[f"gpt {kind}"] = fsdp_tp.difference(
            full, fsdp_tp.one_process_gpt(kind, 3), kind
        )
    out["gpt held"] = {n: tuple(p.shape) for n, p in model.named_parameters()}
    out["gpt keys"] = sorted(full) == sorted(fsdp_tp.start_gpt())
    summed = full_state_dict(fsdp_tp.train_gpt(mesh, "SGD", 3, _doubled), mesh)
    ref = fsdp_tp.one_process_gpt("SGD", 3)
    out["gpt summed"] = fsdp_tp.difference(summed, ref, "SGD")
    return out


results = on_ranks(_on_ranks, 4, timeout=60)


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


def test_gpt_blocks_equal_one_process(results: list[dict]) -> None:
    for r in results:
        assert r["gpt keys"], r
        for name in ("gpt gradients", "gpt SGD", "gpt AdamW"):
            assert r[name] <= ATOL, (name, r[name])


def test_gpt_gradients_summed_over_dp_fail(results: list[dict]) -> None:
    for r in results:
        assert r["gpt summed"] > 100 * ATOL


def test_gpt_ranks_hold_a_quarter_of_the_split_layers(results: list[dict]) -> None:
    # query (32 x 32): 16 rows per tp rank, 8 per dp piece; the vocabulary-split
    # embedding (64 x 32): 32 rows per tp rank, 16 per piece; a norm: 1/2 (dp)
    for r in results:
        held = r["gpt held"]
        assert held["blocks.0.attn.query.weight"] == (8, 32)
        assert held["blocks.1.mlp.proj.weight"] == (16, 64)  # 32 x 128 -> 32 x 64
        assert held["tok.weight"] == (16, 32)
        assert held["blocks.0.ln1.weight"] == (16,)
