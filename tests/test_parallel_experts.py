"""Expert parallelism on real gloo ranks: one MoE layer split over 2 and 4 ranks
gives one process's outputs, loss, gradients (the input's included) and dropped
assignments, with top-1 and top-2, even, uneven and overflowing routing; the
ledger's bytes equal the formula (the rows sent to other ranks), which adds up
across ranks; a MoE TinyGPT trained dp x ep on a 2 x 2 mesh equals one process; bad
input is refused on every rank before any group or message.
tests/controls/test_12_experts.py plants faults under the same checks."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from helpers import disagreements, refused_alike, timed_error
from spawned import (
    names_each_case,
    on_ranks,
    once,
    rank_1_differs,
    refused_before_any_group,
)

from distcourse.examples.gpt import GPTConfig
from distcourse.parallel import experts, hybrid
from distcourse.parallel.experts import cost

CASES = {
    "top1": dict(top_k=1),
    "top2": dict(top_k=2),
    "top1 skewed": dict(top_k=1, skew=6.0),  # every token wants expert 0
    "top2 skewed, capacity 1": dict(top_k=2, skew=6.0, capacity_factor=1.0),
}


def _layers() -> dict[str, dict]:
    torch.set_num_threads(1)
    found = {
        name: experts.layer_against_one_process(**kw) for name, kw in CASES.items()
    }
    if dist.get_world_size() == 4:
        mesh = hybrid.make_mesh(hybrid.Layout(dp=2, ep=2))
        for k in (1, 2):
            cfg = experts.MoEConfig(top_k=k)
            found[f"dp x ep, top{k}"] = experts.model_against_one_process(mesh, cfg)
    return found


runs = on_ranks(_layers, 2, 4, timeout=120)


def test_the_layer_equals_one_process(runs: list[dict[str, dict]]) -> None:
    for found in runs:
        for name in CASES:
            r = found[name]
            lines = experts.lines(r)
            assert all(ln.endswith(("PASS", "True")) for ln in lines), (name, lines)
            assert r["grad_diff"] <= experts.TOL and r["out_diff"] <= experts.TOL


def test_routing_is_uneven_and_drops(runs: list[dict[str, dict]]) -> None:
    """The cases cover what they claim: uneven counts, and drops past capacity."""
    r = runs[0]
    assert len(set(r["top1"]["sent"])) > 1  # uneven counts to the peers
    assert r["top1 skewed"]["load"][0] == sum(r["top1 skewed"]["load"])
    assert r["top1 skewed"]["dropped"] > 0 and r["top2 skewed, capacity 1"]["dropped"]


def test_ledger_bytes_are_the_rows_sent_away(runs: list[dict[str, dict]]) -> None:
    n = len(runs)
    for name in CASES:
        got = [found[name] for found in runs]
        assert all(r["bytes"] == r["formula"] for r in got), name
        # every row one rank sends away is a row another receives
        away = [sum(r["sent"]) - r["sent"][i] for i, r in enumerate(got)]
        come = [sum(r["received"]) - r["received"][i] for i, r in enumerate(got)]
        assert sum(away) == sum(come)
        counts = 8 * 4 * (n - 1) // n  # 4 experts' int64 counts, even
        row = 16 * 4
        for i, r in enumerate(got):
            assert r["formula"] == counts + 2 * (away[i] + come[i]) * row


def test_dp_by_ep_equals_one_process(runs: list[dict[str, dict]]) -> None:
    if len(runs) != 4:
        pytest.skip("the 2 x 2 mesh needs 4 ranks")
    for rank, found in enumerate(runs):
        for k in (1, 2):
            r = found[f"dp x ep, top{k}"]
            assert all(ln.endswith("PASS") for ln in experts.lines(r))
            assert r["losses"][-1] < r["losses"][0]  # it learns
            assert r["experts_here"][0] == ([0, 1] if rank % 2 == 0 else [2, 3])


def _bad_input() -> list[str]:
    return refused_before_any_group(
        {
            "experts": lambda: experts.shard_experts(experts.MoE(8, 3), None),
            "top_k": lambda: experts.MoE(8, 4, top_k=5),
            "capacity": lambda: experts.MoE(8, 4, capacity_factor=0.0),
            "config": lambda: experts.MoEConfig(n_experts=4, capacity_factor=-1.0),
        }
    )


def test_bad_input_is_refused_on_every_rank() -> None:
    assert refused_alike(_bad_input) == [
        "experts: n_experts=3 is not divisible by ep size 2",
        "top_k: top_k=5 is larger than the 4 experts",
        "capacity: capacity_factor must be positive, got 0.0: an expert with no "
        "room would drop every token",
        "config: capacity_factor must be positive, got -1.0: an expert with no "
        "room would drop every token",
    ]


def test_router_order_capacity_and_aux() -> None:
    """First choices before second ones; tokens in order within a choice; the
    Switch loss is 1 for an even router."""
    logits = torch.tensor([[3.0, 2.0, 0.0], [3.0, 0.0, 2.0], [3.0, 2.0, 0.0]])
    r = experts.route(logits, top_k=2, capacity_factor=1.0)  # room for 2 each
    assert experts.capacity(3, 3, 2, 1.0) == 2
    assert r.expert.tolist() == [0, 0, 0, 1, 2, 1]
    assert r.kept.tolist() == [True, True, False, True, True, True]
    assert r.load.tolist() == [3, 2, 1]
    even = experts.route(torch.zeros(4, 2), top_k=1, capacity_factor=1.0)
    torch.testing.assert_close(even.aux, torch.tensor(1.0))


def test_balanced_bytes_is_step_bytes_for_even_counts() -> None:
    """An even router that drops nothing: the planner's estimate is exact."""
    tokens, n, c, e, k = 8, 4, 16, 4, 2
    per_peer = k * tokens // n
    t = experts.Traffic((per_peer,) * n, (per_peer,) * n, 1, c * 4, e)
    assert cost.balanced_bytes(tokens, c, e, k, n) == cost.step_bytes(t)
    assert cost.balanced_bytes(tokens, c, e, k, 1) == 0
    mem = cost.memory_per_rank(tokens, c, e, k, 1.25, ep=2)
    assert mem["experts"] == 2 * (2 * c * 4 * c + 4 * c + c) * 4


def _disagreeing() -> dict:
    """Layers that differ on rank 1: each one's error and how soon it came."""
    odd = dist.get_rank() == 1
    return {
        "count": timed_error(
            lambda: experts.shard_experts(experts.MoE(8, 4 + 2 * odd))
        ),
        "shape": timed_error(lambda: experts.shard_experts(experts.MoE(8 + odd, 4))),
        "top_k": timed_error(
            lambda: experts.shard_experts(experts.MoE(8, 4, top_k=1 + odd))
        ),
        "model": timed_error(  # rank 1's dense layers differ: its vocabulary
            lambda: experts.parallelize(
                experts.moe_gpt(experts.MoEConfig(gpt=GPTConfig(vocab=64 + odd))),
                hybrid.make_mesh(hybrid.Layout(dp=1, ep=2)),
            )
        ),
    }


disagreeing = once(lambda: disagreements(_disagreeing))

NAMED = {  # a case of _disagreeing -> its whole error, or words of "rank 1 differs"
    "count": rank_1_differs(  # an expert count
        "shard_experts",
        "settings {'n_experts': 6, 'top_k': 1, 'capacity': 1.25}",
        "{'n_experts': 4, 'top_k': 1, 'capacity': 1.25}",
    ),
    "shape": (  # expert shapes
        "shard_experts: rank(s) [1] differ from rank 0",
        "gate.weight float32[4, 9] where rank 0 has gate.weight float32[4, 8]",
    ),
    "top_k": ("'top_k': 2",),
    "model": (  # the dense layers: rank 1's vocabulary
        "parallelize: rank(s) [1] differ from rank 0",
        "tok.weight float32[65, 32] where rank 0 has tok.weight float32[64, 32]",
    ),
}

test_each_bad_call_is_named_alike_on_every_rank = names_each_case(NAMED)
