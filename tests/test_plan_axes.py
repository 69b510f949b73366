"""distcourse.plan's expert (ep) and context (cp) parallelism, in one process: the
GPUs are Layout's product, the impossible inputs are refused by name, and the bytes
on the wire and in memory are chapter 12's formulas (`experts.cost`,
`context.cost`, which tests/test_experts*.py and tests/test_context*.py hold equal
to the ledger and the saved-tensor hooks on real ranks): one source of truth."""

from __future__ import annotations

import dataclasses
import json

import pytest

from distcourse import plan
from distcourse.parallel import hybrid
from distcourse.parallel.context.cost import ring_bytes
from distcourse.parallel.experts.cost import (
    balanced_bytes,
    expert_parameters,
    memory_per_rank,
)
from distcourse.parallel.hybrid.recipe import Machine, links
from distcourse.plan import axes, cli, memory, timing

DENSE = plan.ModelSpec(layers=4, hidden=64, heads=4, seq=32, vocab=128)
MOE = dataclasses.replace(DENSE, experts=8, top_k=2)
FP32, BF16 = plan.DTypePolicy("fp32"), plan.DTypePolicy("bf16")
H100 = plan.named("h100")


def test_gpus_are_layouts_world_and_names_carry_the_new_axes() -> None:
    for dp, tp, pp, ep, cp in ((2, 2, 1, 2, 1), (1, 1, 2, 4, 2), (3, 1, 1, 1, 2)):
        lay = plan.PlanLayout(dp, tp, pp, ep=ep, cp=cp)
        assert lay.gpus == hybrid.Layout(dp, pp, tp, ep, cp).world
    assert plan.PlanLayout(2, 2, ep=2, cp=4).name == "2x2x1 ep2 cp4"
    assert plan.PlanLayout(2, 2).name == "2x2x1"


def test_expert_parameters_are_experts_costs() -> None:
    h = DENSE.hidden
    assert axes.mlp_params(h, 1) == expert_parameters(h)
    extra = DENSE.layers * ((8 - 1) * expert_parameters(h) + h * 8)
    assert MOE.params == DENSE.params + extra
    # ep splits the experts' weights, gradients and AdamW moments; not the rest
    one = plan.predict(MOE, 8, FP32, plan.PlanLayout(), H100).memory
    two = plan.predict(MOE, 8, FP32, plan.PlanLayout(ep=2), H100).memory
    held = 4 * DENSE.layers * 4 * expert_parameters(h)  # 4 experts fewer a block
    assert one["parameters"] - two["parameters"] == held
    assert one["optimizer"] - two["optimizer"] == 2 * held + 4 * 4 * 4 * 4


@pytest.mark.parametrize(
    ("model", "layout", "batch", "match"),
    [
        (DENSE, dict(ep=2), 8, r"ep=2 needs experts > 0"),
        (dataclasses.replace(MOE, experts=6), dict(ep=4), 8, r"experts=6 .* ep=4"),
        (DENSE, dict(cp=3), 8, r"seq=32 does not split into 2 x cp=6"),
        (MOE, dict(dp=2, ep=2), 6, r"batch=6 does not split into dp x ep=4"),
        (DENSE, dict(tp=4, sp=True, cp=16), 8, r"seq=32 / cp=16 is not divisible"),
    ],
)
def test_impossible_axes_are_refused_by_name(
    model: plan.ModelSpec, layout: dict, batch: int, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        plan.predict(model, batch, FP32, plan.PlanLayout(**layout), H100)


def test_moe_inputs_are_checked() -> None:
    with pytest.raises(ValueError, match=r"top_k=3 is more than experts=2"):
        dataclasses.replace(MOE, experts=2, top_k=3)
    with pytest.raises(ValueError, match=r"experts must be an integer >= 0"):
        dataclasses.replace(MOE, experts=-1)
    with pytest.raises(ValueError, match=r"capacity_factor must be a number > 0"):
        dataclasses.replace(MOE, capacity_factor=0)
    with pytest.raises(ValueError, match="gpus|GPUs"):
        plan.check(MOE, 8, plan.PlanLayout(ep=2, cp=2), gpus=2)


@pytest.mark.parametrize("dtype", [FP32, BF16])
def test_wire_bytes_are_chapter_12s_formulas(dtype: plan.DTypePolicy) -> None:
    lay = plan.PlanLayout(dp=2, tp=2, pp=2, micro_batches=2, ep=2, cp=2)
    found = plan.predict(MOE, 16, dtype, lay, H100)
    b, e = 16 // (2 * 2 * 2), H100.precision(dtype).nbytes("value")
    n = b * MOE.seq // 2  # tokens of a micro-batch on a rank
    calls = 2 * MOE.layers // 2  # micro-batches x the rank's blocks
    kv = n * (MOE.hidden // 2) * e
    assert found.wire["cp"] == calls * ring_bytes(kv, 2)
    assert found.wire["ep"] == calls * balanced_bytes(n, MOE.hidden, 8, 2, 2, e)
    parts = {"compute", "memory", "optimizer", "bubble"}
    assert set(found.time) == parts | {"tp", "pp", "dp", "cp", "ep", "total"}


def test_context_parallel_activations_are_a_shorter_sequence() -> None:
    """cp = 2 keeps what a sequence of s / 2 keeps, plus ring attention's K/V
    messages (context.cost: 8X in the backward)."""
    half = dataclasses.replace(DENSE, seq=DENSE.seq // 2)
    for ckpt in ("none", "selective", "full"):
        cp = plan.PlanLayout(cp=2, ckpt=ckpt, bucket_view=True)
        one = plan.PlanLayout(ckpt=ckpt, bucket_view=True)
        got = memory.rank_memory(DENSE, 4, FP32, cp, 0)
        want = memory.rank_memory(half, 4, FP32, one, 0)
        assert got["activations"] == want["activations"]
        ring = 8 * 4 * half.seq * DENSE.hidden * 4
        assert got["buffers"] - want["buffers"] == ring


def test_moe_buffers_and_flops() -> None:
    lay = plan.PlanLayout(ep=2, bucket_view=True)  # no DDP buckets
    got = memory.rank_memory(MOE, 8, FP32, lay, 0)["buffers"]
    n = 8 // 2 * MOE.seq
    assert got == memory_per_rank(n, 64, 8, 2, 1.25, 2, 4)["buffers"]
    dense = timing.stage_flops(DENSE, 4, plan.PlanLayout(), 0)
    moe = timing.stage_flops(MOE, 4, plan.PlanLayout(), 0)
    n, h = 4 * MOE.seq, MOE.hidden
    assert moe - dense == 3 * MOE.layers * n * (16 * h * h + 2 * h * 8)


def test_links_of_three_axes_are_recipes() -> None:
    for gpus in (8, 16):
        hw = dataclasses.replace(H100, gpus_per_node=4)
        for layout in hybrid.layouts(gpus):
            lay = plan.PlanLayout(layout.dp, layout.tp, layout.pp)
            machine = Machine(hw.name, 4, 0, 0, 0)
            assert timing.axis_links(lay, hw) == links(layout, machine)
    lay = plan.PlanLayout(dp=2, tp=2, ep=2, cp=2)
    where = timing.axis_links(lay, dataclasses.replace(H100, gpus_per_node=8))
    assert where == dict(tp="node", pp="-", dp="network", cp="node", ep="node")


def test_round_trip_and_cli() -> None:
    found = plan.predict(MOE, 8, BF16, plan.PlanLayout(dp=2, ep=2, cp=2), H100)
    data = json.loads(json.dumps(found.to_dict()))
    assert plan.Prediction.from_dict(data).to_dict() == data
    assert data["gpus"] == 8
    shape = "--layers 4 --hidden 64 --heads 4 --seq 32 --vocab 128 --batch 8"
    args = [*shape.split(), "--experts", "8", "--top-k", "2"]
    text = cli.run([*args, "--layout", "dp=2,ep=2,cp=2"])
    assert "2x1x1 ep2 cp2" in text and " cp " in text and " ep " in text
    assert cli.main([*shape.split(), "--layout", "ep=2"]) == 2
    assert "== distcourse.plan.axes ==" in cli.run(["--explain"])


def test_search_keeps_fixed_ep_and_cp_and_zero3_gathers_the_experts() -> None:
    found = plan.search(MOE, 16, BF16, H100, 16, {"ep": 2, "cp": 2})
    assert found and all(p.layout.ep == p.layout.cp == 2 for p in found)
    assert all(p.layout.gpus == 16 for p in found)
    lay = plan.PlanLayout(dp=2, zero=3, bucket_view=True)
    moe = memory.rank_memory(MOE, 8, FP32, lay, 0)["buffers"]
    dense = memory.rank_memory(DENSE, 8, FP32, lay, 0)["buffers"]
    n, h = 8 // 2 * MOE.seq, MOE.hidden
    gathered = 2 * 4 * (7 * axes.mlp_params(h, 1) + h * 8)  # weights and grads
    assert moe - dense == gathered + memory_per_rank(n, h, 8, 2, 1.25, 1, 4)["buffers"]
