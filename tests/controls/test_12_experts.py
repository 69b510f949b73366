"""Negative controls for chapter 12's verdicts: the checks the chapter runs
(`experts.layer_against_one_process`, `experts.model_against_one_process`, printed
by `experts.lines`) on planted faults print FAIL / False.

One spawn of 4 ranks (the chapter's count) runs every fault: experts sharded to the
wrong rank; each rank's capacity computed for the whole batch (the drops change);
a layer whose input needs no gradient (the dispatch's backward never runs, so the
ledger sees three all_to_alls of rows where the formula counts four); and on the
2 x 2 mesh, expert gradients summed over dp instead of averaged (x2), or
all-reduced over the world (mixing different experts).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from distcourse.launch import spawn
from distcourse.mesh import Mesh
from distcourse.parallel import experts, hybrid
from distcourse.parallel.experts.model import is_expert

SKEWED = dict(top_k=1, skew=6.0)  # the chapter's case with drops


def wrong_block(moe: experts.MoE, group: dist.ProcessGroup | None) -> experts.MoE:
    """Each rank keeps the next rank's experts, but routes as if they were its own."""
    n, me = dist.get_world_size(group), dist.get_rank(group)
    every = list(moe.experts)
    experts.shard_experts(moe, group)
    local = len(moe.experts)
    start = (me + 1) % n * local
    moe.experts = nn.ModuleList(every[start : start + local])
    return moe


def whole_batch_capacity(
    moe: experts.MoE, group: dist.ProcessGroup | None
) -> experts.MoE:
    """Each rank's capacity computed as if it routed the whole batch (n x tokens)."""
    experts.shard_experts(moe, group)
    moe.capacity_factor *= dist.get_world_size(group)
    return moe


def summed_over_dp(model: nn.Module, mesh: Mesh) -> None:
    """Expert gradients summed over the dp replicas, not averaged: x dp."""
    experts.average_gradients(model, mesh)
    for name, p in model.named_parameters():
        if is_expert(name):
            p.grad.mul_(mesh.size("dp"))


def over_the_world(model: nn.Module, mesh: Mesh) -> None:
    """Expert gradients averaged over every rank: different experts mixed."""
    world = dist.get_world_size()
    for _, p in model.named_parameters():
        dist.all_reduce(p.grad)
        p.grad /= world


def _faults() -> dict[str, list[str]]:
    torch.set_num_threads(1)
    layer = experts.layer_against_one_process
    found = {
        "wrong block": layer(**SKEWED, shard=wrong_block),
        "capacity": layer(**SKEWED, shard=whole_batch_capacity),
        "no input grad": layer(**SKEWED, input_grad=False),
    }
    got = {k: experts.lines(v, "MoE top-1 skewed") for k, v in found.items()}
    mesh = hybrid.make_mesh(hybrid.Layout(dp=2, ep=2))
    for name, average in (("summed", summed_over_dp), ("world", over_the_world)):
        r = experts.model_against_one_process(mesh, average=average)
        got[name] = experts.lines(r, "dp x ep TinyGPT top-1")
    return got


@pytest.fixture(scope="module")
def lines() -> dict[str, list[str]]:
    """Rank 0's lines for every fault (one spawn for the whole file)."""
    return spawn(_faults, 4, timeout=120)[0]


def _line(lines: list[str], words: str) -> str:
    (hit,) = [ln for ln in lines if words in ln]
    return hit


@pytest.mark.controls(
    "12_experts",
    r"MoE top-.* outputs vs one process",
    fault="each rank keeps the next rank's experts",
)
@pytest.mark.controls(
    "12_experts",
    r"MoE top-.* gradients vs one process",
    fault="each rank keeps the next rank's experts",
)
@pytest.mark.controls(
    "12_experts",
    r"MoE top-.* loss vs one process",
    fault="each rank keeps the next rank's experts",
)
def test_experts_on_the_wrong_rank_fail(lines: dict) -> None:
    got = lines["wrong block"]
    for what in ("outputs", "gradients", "loss"):
        assert _line(got, f" {what} vs one process").endswith("FAIL"), got


@pytest.mark.controls(
    "12_experts",
    r"drops the same assignments as one process",
    fault="each rank's capacity computed for the whole batch (n x its tokens)",
)
def test_capacity_of_the_whole_batch_drops_other_tokens(lines: dict) -> None:
    got = lines["capacity"]
    assert _line(got, "drops the same").endswith("False"), got
    assert _line(got, "outputs vs one process").endswith("FAIL"), got


@pytest.mark.controls(
    "12_experts",
    r"ledger bytes == formula",
    fault="the layer's input needs no gradient: the dispatch's backward never runs",
)
def test_a_missing_all_to_all_is_seen_by_the_ledger(lines: dict) -> None:
    got = lines["no input grad"]
    assert _line(got, "ledger bytes").endswith("False"), got
    assert _line(got, "gradients vs one process").endswith("PASS"), got


@pytest.mark.controls(
    "12_experts",
    r"dp x ep TinyGPT .* gradients vs one process",
    fault="expert gradients summed over dp, not averaged (x2)",
)
@pytest.mark.controls(
    "12_experts",
    r"dp x ep TinyGPT .* params vs one process",
    fault="expert gradients summed over dp, not averaged (x2)",
)
@pytest.mark.controls(
    "12_experts",
    r"dp x ep TinyGPT .* loss vs one process",
    fault="expert gradients averaged over all ranks, mixing different experts",
)
def test_expert_gradients_summed_or_mixed_fail(lines: dict) -> None:
    for fault in ("summed", "world"):
        got = lines[fault]
        for what in ("gradients", "params", "loss"):
            assert _line(got, f" {what} vs one process").endswith("FAIL"), (fault, got)
