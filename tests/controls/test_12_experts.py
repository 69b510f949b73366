"""Negative controls for chapter 12's verdicts: the checks the chapter runs
(`experts.layer_against_one_process`, `experts.model_against_one_process`, printed
by `experts.lines`) on planted faults print FAIL / False.

One spawn of 4 ranks (the chapter's count) runs every fault: experts sharded to the
wrong rank; each rank's capacity computed for the whole batch (the drops change);
a router that serves each rank's tokens last to first (other tokens dropped); a
dispatch that pads every block to a multiple of 8 rows (bytes the routing does not
send); a layer whose input needs no gradient (the dispatch's backward never runs, so
the ledger sees three all_to_alls of rows where the formula counts four); and on the
2 x 2 mesh, expert gradients summed over dp instead of averaged (x2), or
all-reduced over the world (mixing different experts). The dropless layer: a grouped
matmul whose offsets are shifted by one row, the balancing bias updated from the
rank's own load (not the group's), the bias added to the gate weights, and the
padded dispatch.
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
BALANCED = dict(top_k=2, balance_rate=1e-2, steps=3, skew=6.0)  # dropless


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


def last_to_first(moe: experts.MoE, group: dist.ProcessGroup | None) -> experts.MoE:
    """A router that serves the tokens last to first: other tokens are dropped."""
    experts.shard_experts(moe, group)
    k = moe.top_k

    def route(flat: torch.Tensor) -> experts.Routing:
        r = experts.MoE.route(moe, flat.flip(0))
        T = flat.shape[0]

        def back(t: torch.Tensor) -> torch.Tensor:  # to (slot, token) order again
            return t.view(k, T).flip(1).reshape(-1)

        token = T - 1 - back(r.token)
        return experts.Routing(
            back(r.expert), token, back(r.weight), back(r.kept), r.load, r.aux
        )

    moe.route = route
    return moe


def padded_rows(
    x: torch.Tensor, send: list[int], recv: list[int], group: dist.ProcessGroup | None
) -> torch.Tensor:
    """The rows' all_to_all with every block padded by zero rows to a multiple of 8
    (as alignment padding for a grouped matmul would): the same rows arrive, and
    rows the routing never sent cross the wire."""

    def up(c: int) -> int:
        return -(-c // 8) * 8

    blocks = [
        torch.cat([b, b.new_zeros((up(len(b)) - len(b), *x.shape[1:]))])
        for b in x.split(send)
    ]
    out = experts.all_to_all_rows(
        torch.cat(blocks), [up(c) for c in send], [up(c) for c in recv], group
    )
    starts = [sum(up(c) for c in recv[:i]) for i in range(len(recv))]
    keep = [i for c, s in zip(recv, starts, strict=True) for i in range(s, s + c)]
    return out[torch.tensor(keep, dtype=torch.long, device=out.device)]


def padded(moe: nn.Module, group: dist.ProcessGroup | None) -> nn.Module:
    """Either layer, sharded, its rows moved by `padded_rows`."""
    shard = experts.shard_dropless if hasattr(moe, "w1") else experts.shard_experts
    shard(moe, group)
    moe.a2a = padded_rows
    return moe


def shifted_offsets(
    moe: experts.DroplessMoE, group: dist.ProcessGroup | None
) -> experts.DroplessMoE:
    """A grouped matmul whose block ends are one row early: each block's last row
    goes through the next expert."""
    experts.shard_dropless(moe, group)

    def matmul(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        bad = offs.clone()
        bad[:-1] = (bad[:-1] - 1).clamp(min=0)
        return experts.grouped_mm(x, w, bad)

    moe.matmul = matmul
    return moe


def local_load(
    moe: experts.DroplessMoE, group: dist.ProcessGroup | None
) -> experts.DroplessMoE:
    """The balancing bias updated from this rank's load, not the group's."""
    experts.shard_dropless(moe, group)
    moe.balance = lambda: moe.update_bias(moe.load)
    return moe


def bias_weighs(
    moe: experts.DroplessMoE, group: dist.ProcessGroup | None
) -> experts.DroplessMoE:
    """The balancing bias added to the gate weights as well as to the choice."""
    experts.shard_dropless(moe, group)

    def select(logits: torch.Tensor) -> tuple[torch.Tensor, ...]:
        expert, token, weight = experts.DroplessMoE.select(moe, logits)
        return expert, token, weight + moe.bias[expert]

    moe.select = select
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
        "last to first": layer(**SKEWED, shard=last_to_first),
        "padded": layer(**SKEWED, shard=padded),
    }
    got = {k: experts.lines(v, "MoE top-1 skewed") for k, v in found.items()}
    dropless = experts.dropless_against_one_process
    what = "dropless top-2 sigmoid, bias-balanced"
    for name, shard in (
        ("shifted", shifted_offsets),
        ("local load", local_load),
        ("bias weighs", bias_weighs),
        ("dropless padded", padded),
    ):
        got[name] = experts.dropless_lines(dropless(**BALANCED, shard=shard), what)
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
    r"drops the same assignments as one process",
    fault="a router that serves each rank's tokens last to first",
)
def test_a_router_in_another_order_drops_other_tokens(lines: dict) -> None:
    got = lines["last to first"]
    assert _line(got, "drops the same").endswith("False"), got
    assert _line(got, "outputs vs one process").endswith("FAIL"), got


@pytest.mark.controls(
    "12_experts",
    r"MoE top-.*ledger bytes == formula",
    fault="the dispatch pads every block to a multiple of 8 rows",
)
@pytest.mark.controls(
    "12_experts",
    r"dropless .*ledger bytes == routed rows",
    fault="the dispatch pads every block to a multiple of 8 rows",
)
def test_padded_blocks_are_seen_by_the_ledger(lines: dict) -> None:
    for fault in ("padded", "dropless padded"):
        got = lines[fault]
        assert _line(got, "ledger bytes").endswith("False"), (fault, got)
        assert _line(got, "outputs vs one process").endswith("PASS"), (fault, got)
        assert _line(got, "gradients vs one process").endswith("PASS"), (fault, got)


@pytest.mark.controls(
    "12_experts",
    r"dropless .* outputs vs one process",
    fault="the grouped matmul's block ends shifted one row early",
)
@pytest.mark.controls(
    "12_experts",
    r"dropless .* loss vs one process",
    fault="the grouped matmul's block ends shifted one row early",
)
@pytest.mark.controls(
    "12_experts",
    r"dropless .* gradients vs one process",
    fault="the grouped matmul's block ends shifted one row early",
)
def test_shifted_offsets_fail(lines: dict) -> None:
    got = lines["shifted"]
    for what in ("outputs", "loss", "gradients"):
        assert _line(got, f" {what} vs one process").endswith("FAIL"), got


@pytest.mark.controls(
    "12_experts",
    r"dropless .* balancing bias vs one process",
    fault="the bias updated from the rank's own load, not the group's",
)
def test_a_bias_from_the_local_load_fails(lines: dict) -> None:
    got = lines["local load"]
    assert _line(got, "balancing bias vs one process").endswith("FAIL"), got


@pytest.mark.controls(
    "12_experts",
    r"dropless .* weights are the scores, not the bias",
    fault="the balancing bias added to the gate weights",
)
def test_a_bias_that_weighs_fails(lines: dict) -> None:
    got = lines["bias weighs"]
    assert _line(got, "weights are the scores").endswith("False"), got


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
