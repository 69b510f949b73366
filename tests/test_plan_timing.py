"""plan.timing's step: matmuls at their dtype's reached rate, element-wise work over
memory bandwidth, the optimizer's step, and data-parallel messages hidden behind
the compute they overlap, so the search agrees with chapter 10's FSDP cells (the
rule T >= (d - 1) / d x C / W tokens per rank)."""

from __future__ import annotations

import dataclasses

from distcourse import plan
from distcourse.plan import timing, work

H100 = plan.named("h100")
MODEL = plan.ModelSpec.from_params(7e9, seq=1024)  # chapter 10's FSDP cells
ALL_BF16 = plan.DTypePolicy("bf16", "bf16", "adamw")


def rule(dp: int, where: str) -> float:
    """Tokens per rank above which FSDP's messages can hide (the chapter's C/W)."""
    return (dp - 1) / dp * H100.rate("bf16") / (1 / H100.link(where)[1])


def fsdp(batch: int, dp: int) -> plan.Prediction:
    return plan.predict(MODEL, batch, ALL_BF16, plan.PlanLayout(dp=dp, zero=3), H100)


def test_the_planners_fsdp_times_meet_at_the_chapters_rule() -> None:
    for where, dp in (("node", 8), ("network", 64)):
        p = fsdp(dp, dp)
        meet = MODEL.seq * p.messages["dp"] / p.time["compute"]
        assert abs(meet / rule(dp, where) - 1) <= 0.05, (where, meet, rule(dp, where))


def test_fsdp_messages_hide_above_the_rule_and_show_below_it() -> None:
    """One node (dp 8, the rule about 1,250 tokens): at 2048 tokens a rank nothing
    is exposed; at 1024 the forward's all-gather and the backward's all-gather and
    reduce-scatter show by what they exceed their pass. Across nodes (dp 64, ten
    times the tokens) 2048 are not enough."""
    assert 1024 < rule(8, "node") < 2048 < rule(64, "network")
    above, below = fsdp(16, 8), fsdp(8, 8)
    assert above.messages["dp"] > 0 and above.time["dp"] == 0.0
    assert 0 < below.time["dp"] < below.messages["dp"]
    ag = below.messages["dp"] / 3  # two all-gathers and a reduce-scatter, equal
    prec = H100.precision(ALL_BF16)
    flops, traffic, fwd_flops, fwd_traffic = timing.rank_work(
        MODEL, 1, below.layout, prec, 0
    )
    forward = fwd_flops / H100.rate("bf16") + fwd_traffic / H100.streamed
    backward = flops / H100.rate("bf16") + traffic / H100.streamed - forward
    want = max(0.0, ag - forward) + max(0.0, 2 * ag - backward)
    assert abs(below.time["dp"] / want - 1) < 1e-9
    assert fsdp(128, 64).time["dp"] > 0  # 2048 tokens a rank, over the network


def test_the_search_picks_fsdp_where_the_chapter_says_it_is_compute_bound() -> None:
    """On one node of 8 H100s with 2048 tokens a rank, FSDP (ZeRO-3, no pipeline,
    no tensor parallelism) is the fastest layout and hides every message; the
    non-overlapping planner preferred a pipeline with ZeRO-1."""
    best = plan.search(MODEL, 16, ALL_BF16, H100, 8)[0]
    assert (best.layout.zero, best.layout.pp, best.layout.tp) == (3, 1, 1)
    assert best.time["dp"] == 0.0 and best.messages["dp"] > 0


def test_ddp_hides_its_all_reduce_and_zero_1_shows_its_all_gather() -> None:
    """DDP's all-reduce runs beside backward; ZeRO-1's all-gather of the updated
    weights runs after the step, with nothing to hide behind."""
    ddp = plan.predict(MODEL, 64, ALL_BF16, plan.PlanLayout(dp=8), H100)
    one = plan.predict(MODEL, 64, ALL_BF16, plan.PlanLayout(dp=8, zero=1), H100)
    assert ddp.time["dp"] == 0.0 < ddp.messages["dp"]
    assert abs(one.time["dp"] / (one.messages["dp"] / 2) - 1) < 1e-9


def test_element_wise_work_and_the_optimizer_run_at_memory_bandwidth() -> None:
    """amp-bf16 moves the residual stream and norms in fp32 and casts each Linear's
    input: more bytes than bf16, as many as fp32; its matmuls run at bf16's rate."""
    model = plan.ModelSpec(12, 768, 12, 1024, 32000)
    layout = plan.PlanLayout()
    moved = {
        dtype: work.block_traffic(
            model, 8, layout, H100.precision(plan.DTypePolicy(dtype))
        )
        for dtype in ("fp32", "bf16", "amp-bf16")
    }
    assert moved["bf16"] < moved["fp32"] < moved["amp-bf16"]
    h, n = 768, 8 * 1024
    assert moved["fp32"] == n * h * 72  # norms 2 x 8, adds 2 x 12, GELU 32
    found = {
        d: plan.predict(model, 8, plan.DTypePolicy(d), layout, H100)
        for d in ("fp32", "amp-bf16")
    }
    assert found["amp-bf16"].time["compute"] < found["fp32"].time["compute"] / 10
    stepped = model.params
    fused = dataclasses.replace(plan.DTypePolicy("fp32"), optimizer="adamw-fused")
    seconds = plan.predict(model, 8, fused, layout, H100).time["optimizer"]
    assert abs(seconds / (28 * stepped / H100.streamed) - 1) < 1e-9
