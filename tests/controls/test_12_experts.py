"""Negative controls of chapter 12: its own cells, run with a fault planted in the
code under test (the router, the sharded layer, the dispatch, the dropless layer,
the dp x ep gradient step), must turn each verdict they print from PASS to FAIL.

The router's own line compares `route` with the rule worked by hand for six tokens:
the layer's check against one process cannot see a fault in `route`, since the one
process routes with it too (shown below, not assumed). The other faults are planted
in the distributed layer only (this module's replacement of the check's
`shard_experts`, or of its gradient step), so the one process stays right. One
spawn of the chapter's 4 ranks runs them all (tests/controls/harness.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import harness
import torch
import torch.distributed as dist
from harness import Fault, Plant
from torch import Tensor, nn

from distcourse.mesh import Mesh
from distcourse.parallel import experts
from distcourse.parallel.experts import check, dropless_check, layer, router
from distcourse.parallel.experts.model import is_expert

CHAPTER = harness.Chapter(
    "12_experts", setup=["experts.shard_experts(moe)"], stored=True
)
ROUTER = ["r = experts.route(logits", "by_hand = ["]  # the cells, by a text of each
LAYER = ["CASES = {", "for what, r in FOUND.items():"]
MODEL = ["layout = hybrid.Layout(dp=2, ep=2)"]
DROPLESS = ["DROPLESS = {"]


def one_more_room(real: Callable) -> Callable:
    """The router's capacity one more than ceil(factor x k x T / E)."""
    return lambda *args: real(*args) + 1


def reversed_route(logits: Tensor, top_k: int, capacity_factor: float) -> Any:
    """A router that serves the tokens last to first: other tokens are dropped."""
    r = router.route(logits.flip(0), top_k, capacity_factor)
    T = logits.shape[0]

    def back(t: Tensor) -> Tensor:  # to (slot, token) order again
        return t.view(top_k, T).flip(1).reshape(-1)

    token = T - 1 - back(r.token)
    return experts.Routing(
        back(r.expert), token, back(r.weight), back(r.kept), r.load, r.aux
    )


def wrong_block(moe: experts.MoE, group: Any) -> experts.MoE:
    """Each rank keeps the next rank's experts, but routes as if they were its own."""
    n, me = dist.get_world_size(group), dist.get_rank(group)
    every = list(moe.experts)
    experts.shard_experts(moe, group)
    local = len(moe.experts)
    start = (me + 1) % n * local
    moe.experts = nn.ModuleList(every[start : start + local])
    return moe


def whole_batch_capacity(moe: experts.MoE, group: Any) -> experts.MoE:
    """Each rank's capacity computed as if it routed the whole batch (n x tokens)."""
    experts.shard_experts(moe, group)
    moe.capacity_factor *= dist.get_world_size(group)
    return moe


def last_to_first(moe: experts.MoE, group: Any) -> experts.MoE:
    """The sharded layer routes its tokens last to first: other tokens dropped."""
    experts.shard_experts(moe, group)
    moe.groups, k = 1, moe.top_k

    def route(flat: Tensor) -> experts.Routing:
        logits = moe.gate(flat)
        return reversed_route(logits, k, moe.capacity_factor)

    moe.route = route
    return moe


def padded_rows(x: Tensor, send: list[int], recv: list[int], group: Any) -> Tensor:
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


def fixed_buffers(x: Tensor, send: list[int], recv: list[int], group: Any) -> Tensor:
    """The rows' all_to_all with every block padded to the most rows any rank moves
    (GShard's fixed buffers, sized for the worst case, as a dropless layer's would
    have to be): the same rows arrive, and rows never routed cross the wire."""
    most = torch.tensor([len(x)], device=x.device)
    dist.all_reduce(most, op=dist.ReduceOp.MAX, group=group)
    worst = int(most.item())
    blocks = [
        torch.cat([b, b.new_zeros((worst - len(b), *x.shape[1:]))])
        for b in x.split(send)
    ]
    n = len(send)
    out = experts.all_to_all_rows(torch.cat(blocks), [worst] * n, [worst] * n, group)
    keep = [i for q, c in enumerate(recv) for i in range(q * worst, q * worst + c)]
    return out[torch.tensor(keep, dtype=torch.long, device=out.device)]


def dropless_with(change: Callable[[experts.DroplessMoE], None]) -> Callable:
    """The dropless layer's sharding, then `change(layer)`: a fault in it."""

    def shard(moe: experts.DroplessMoE, group: Any, **kwargs: Any) -> Any:
        experts.shard_dropless(moe, group, **kwargs)
        change(moe)
        return moe

    return shard


def shifted_offsets(moe: experts.DroplessMoE) -> None:
    """A grouped matmul whose block ends are one row early: each block's last row
    goes through the next expert."""

    def matmul(x: Tensor, w: Tensor, offs: Tensor) -> Tensor:
        bad = offs.clone()
        bad[:-1] = (bad[:-1] - 1).clamp(min=0)
        return experts.grouped_mm(x, w, bad)

    moe.matmul = matmul


def local_load(moe: experts.DroplessMoE) -> None:
    """The balancing bias updated from this rank's load, not the group's."""
    moe.balance = lambda: moe.update_bias(moe.load)


def bias_weighs(moe: experts.DroplessMoE) -> None:
    """The balancing bias added to the gate weights as well as to the choice."""

    def select(logits: Tensor) -> tuple[Tensor, ...]:
        expert, token, weight = experts.DroplessMoE.select(moe, logits)
        return expert, token, weight + moe.bias[expert]

    moe.select = select


def pads(moe: experts.DroplessMoE) -> None:
    moe.a2a = fixed_buffers


def summed_over_dp(model: nn.Module, mesh: Mesh) -> None:
    """Expert gradients summed over the dp replicas, not averaged: x dp."""
    experts.average_gradients(model, mesh)
    for name, p in model.named_parameters():
        if is_expert(name):
            p.grad.mul_(mesh.size("dp"))


def over_the_world(model: nn.Module, mesh: Mesh) -> None:
    """Expert gradients averaged over every rank: different experts mixed."""
    for _, p in model.named_parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()


def sharded(fake: Callable) -> Plant:
    """The check's layer split by `fake` instead of shard_experts."""
    return Plant(check, "shard_experts", fake)


FAULTS = {
    "room for one more": Fault(ROUTER, Plant(router, "capacity", one_more_room, True)),
    "router last to first": Fault(ROUTER, Plant(experts, "route", reversed_route)),
    "route blind spot": Fault(LAYER, Plant(router, "capacity", one_more_room, True)),
    "wrong block": Fault(LAYER, sharded(wrong_block)),
    "capacity": Fault(LAYER, sharded(whole_batch_capacity)),
    "layer last to first": Fault(LAYER, sharded(last_to_first)),
    "padded": Fault(LAYER, Plant(layer, "all_to_all_rows", padded_rows)),
    "summed": Fault(MODEL, Plant(check, "average_gradients", summed_over_dp)),
    "world": Fault(MODEL, Plant(check, "average_gradients", over_the_world)),
}
for name, change in {
    "shifted": shifted_offsets,
    "local load": local_load,
    "bias weighs": bias_weighs,
    "dropless padded": pads,
}.items():
    FAULTS[name] = Fault(
        DROPLESS, Plant(dropless_check, "shard_dropless", dropless_with(change))
    )


CONTROLS = harness.Controls(
    "12_experts",
    test_a_router_with_room_for_one_more_fails_the_hand_count=harness.Flip(
        ["room for one more"],
        r"route\(\) == the rule worked by hand, token by token",
        "the router's capacity one more than ceil(factor x k x T / E)",
    ),
    test_a_router_serving_last_to_first_fails_the_hand_count=harness.Flip(
        ["router last to first"],
        r"route\(\) == the rule worked by hand, token by token",
        "a router that serves the tokens last to first",
    ),
    test_experts_on_the_wrong_rank_fail=harness.Flip(
        ["wrong block"],
        r"MoE top-.* (outputs|loss|gradients) vs one process",
        "each rank keeps the next rank's experts",
    ),
    test_capacity_of_the_whole_batch_drops_other_tokens=harness.Flip(
        ["capacity"],
        r"MoE top-.* drops the same assignments as one process",
        "each rank's capacity computed for the whole batch (n x its tokens)",
    ),
    test_a_layer_serving_last_to_first_drops_other_tokens=harness.Flip(
        ["layer last to first"],
        r"MoE top-.* drops the same assignments as one process",
        "the sharded layer serving its tokens last to first",
    ),
    test_padded_blocks_are_seen_by_the_ledger=harness.Flip(
        ["padded"],
        r"MoE top-.*ledger bytes == formula",
        "the dispatch pads every block to a multiple of 8 rows",
    ),
    test_expert_gradients_summed_over_dp_fail=harness.Flip(
        ["summed"],
        r"dp x ep TinyGPT .* (gradients|params|loss) vs one process",
        "expert gradients summed over dp, not averaged (x2)",
    ),
    test_expert_gradients_mixed_over_the_world_fail=harness.Flip(
        ["world"],
        r"dp x ep TinyGPT .* (gradients|params|loss) vs one process",
        "expert gradients averaged over all ranks, mixing different experts",
    ),
    test_shifted_offsets_fail=harness.Flip(
        ["shifted"],
        r"dropless .* (outputs|loss|gradients) vs one process",
        "the grouped matmul's block ends shifted one row early",
    ),
    test_a_bias_from_the_local_load_fails=harness.Flip(
        ["local load"],
        r"dropless .* balancing bias vs one process",
        "the bias updated from the rank's own load, not the group's",
    ),
    test_a_bias_that_weighs_fails=harness.Flip(
        ["bias weighs"],
        r"dropless .* weights are the scores, not the bias",
        "the balancing bias added to the gate weights",
    ),
    test_padded_dropless_blocks_are_seen_by_the_ledger=harness.Flip(
        ["dropless padded"],
        r"dropless .*ledger bytes == routed rows",
        "the dispatch pads every block to the rank's whole dispatch (fixed buffers)",
    ),
)
globals().update(CONTROLS.tests())


def test_the_drops_line_cannot_see_a_fault_in_route(ran: harness.Ran) -> None:
    """Why the router's line is worked by hand: the layer's check against one process
    still passes with the router's capacity wrong, as both sides call `route`."""
    harness.assert_holds(ran, "route blind spot", r"drops the same assignments")
