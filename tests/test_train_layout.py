"""The trainer's layout: accepted layouts, every composition of the parts, the
refusals that name their flags (only context and expert parallelism of what the
package has), and `--plan`'s choice (`planned`: the planner's fastest layout the
trainer runs)."""

from __future__ import annotations

import pytest

from distcourse import plan
from distcourse.examples.gpt import GPTConfig
from distcourse.train.layout import (
    TrainLayout,
    accepted,
    check,
    compositions,
    fastest_accepted,
    from_plan,
    planned,
)

CFG = GPTConfig(vocab=144, block_size=32, n_layer=4, n_head=4, n_embd=32)
H100 = plan.named("h100")


def test_accepted_layouts_of_4_and_8_ranks() -> None:
    four = [lay.name for lay in accepted(4, CFG)]
    assert four == [
        "4x1x1",
        "2x2x1 m2 1f1b",
        "2x1x2",
        "1x4x1 m2 1f1b",
        "1x2x2 m2 1f1b",
        "1x1x4",
    ]
    eight = [lay.name for lay in accepted(8, CFG)]
    assert "1x8x1 m2 1f1b" not in eight  # 4 blocks do not cut into 8 stages
    assert "1x1x8" not in eight  # 4 heads do not split 8 ways
    assert len(eight) == 8


@pytest.mark.parametrize(
    ("layout", "world", "words"),
    [
        (TrainLayout(dp=4, zero=5), 4, "--zero 5"),
        (TrainLayout(dp=2, pp=2, schedule="interleaved"), 4, "--schedule interl"),
        (TrainLayout(dp=2, pp=2, virtual=2), 4, "--schedule 1f1b with --virtual 2"),
        (TrainLayout(virtual=2, schedule="interleaved"), 1, "--virtual 2 with --pp 1"),
        (TrainLayout(dp=4, ckpt="selective"), 4, "--ckpt selective"),
        (TrainLayout(dp=4, dtype="float16"), 4, "--dtype float16"),
        (TrainLayout(dp=2, cp=2), 4, "--cp 2: this trainer does not compose context"),
        (TrainLayout(dp=2, ep=2), 4, "--ep 2: this trainer does not compose expert"),
        (TrainLayout(dp=2, pp=2), 8, "= 4 ranks, but the world has 8"),
        (TrainLayout(pp=8), 8, "n_layer=4 blocks do not divide into pp=8"),
        (TrainLayout(tp=8), 8, "n_head=4 is not divisible by tp=8"),
        (TrainLayout(dp=3), 3, "a batch of 8 does not split into dp=3"),
        (TrainLayout(dp=2, pp=2, micro_batches=3), 4, "into 3 micro-batches"),
        (TrainLayout(dp=4, micro_batches=3), 4, "into 3 micro-batches"),
        (
            TrainLayout(pp=4, micro_batches=8, schedule="interleaved", virtual=2),
            4,
            "blocks do not divide into pp=4 x virtual=2 = 8 stages",
        ),
    ],
)
def test_refused_before_any_rank_by_name(
    layout: TrainLayout, world: int, words: str
) -> None:
    with pytest.raises(ValueError, match=words.replace("(", r"\(")):
        check(layout, CFG, world, batch=8)


def test_every_composition_of_the_parts_is_accepted() -> None:
    for layout in (
        TrainLayout(dp=2, pp=2, micro_batches=2, fsdp=True),  # FSDP x PP
        TrainLayout(dp=2, tp=2, zero=3, ckpt="full"),  # FSDP x TP, checkpointed
        TrainLayout(dp=4, zero=1),
        TrainLayout(dp=2, pp=2, micro_batches=2, zero=2, dtype="bf16"),
        TrainLayout(dp=4, micro_batches=2),  # accumulated without a pipeline
        TrainLayout(pp=2, tp=2, micro_batches=2, schedule="interleaved", virtual=2),
    ):
        check(layout, CFG, layout.world, batch=8)
    assert TrainLayout(dp=4, zero=3).name == "4x1x1 zero3"
    assert TrainLayout(dp=4, zero=3).data_mode == "fsdp"
    assert TrainLayout(dtype="bf16").dtype == "bfloat16"
    named = TrainLayout(pp=2, micro_batches=2, schedule="interleaved", virtual=2)
    assert named.name == "1x2x1 m2 interleaved v2"
    assert TrainLayout(dp=2, micro_batches=2, dtype="bf16").name == "2x1x1 acc2 bf16"


def test_compositions_of_8_ranks() -> None:
    names = [lay.name for lay in compositions(8, CFG, 16)]
    assert names[:8] == [lay.name for lay in accepted(8, CFG, 16)]
    rest = names[8:]
    for want in ("8x1x1 zero1", "8x1x1 zero2", "8x1x1 fsdp", "8x1x1 acc2"):
        assert want in rest, rest
    for want in ("zero1", "zero2", "fsdp", "ckpt=full fsdp", "ckpt=full"):
        assert f"2x2x2 m2 1f1b {want}" in rest, rest
    assert "2x2x2 m4 gpipe" in rest and "2x2x2 m2 interleaved v2" in rest, rest


def test_counts_are_checked_at_construction() -> None:
    with pytest.raises(ValueError, match="dp"):
        TrainLayout(dp=0)


def trainer_runs(layout: plan.PlanLayout) -> TrainLayout | None:
    """The test's own reading of which planner layouts the trainer runs as is:
    no experts, no context or sequence parallelism, no selective checkpointing,
    FSDP that reshards (`from_plan` then names the trainer's layout)."""
    L = layout
    if L.ep > 1 or L.cp > 1 or L.sp or not L.reshard or L.ckpt == "selective":
        return None
    return from_plan(L)


@pytest.mark.parametrize(
    ("world", "name"), [(4, "2x2x1 m2 1f1b zero1"), (8, "4x2x1 m2 1f1b zero1")]
)
def test_planned_is_the_fastest_layout_the_trainer_accepts(
    world: int, name: str
) -> None:
    layout, prediction = planned(world, CFG, 8, H100)
    check(layout, CFG, world, 8)
    assert layout.name == name
    model = plan.ModelSpec.from_config(CFG)
    policy = plan.DTypePolicy("fp32", "fp32", "adamw")
    mine = []
    for p in plan.search(model, 8, policy, H100, world, {"sp": False}):
        ours = trainer_runs(p.layout)
        if ours is None:
            continue
        try:
            check(ours, CFG, world, 8)
        except ValueError:
            continue
        mine.append((p.time["total"], ours))
    assert mine[0] == (prediction.time["total"], layout)
    assert prediction.time["total"] == min(t for t, _ in mine)


def test_no_plan_the_trainer_runs_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="no layout of 7 GPUs"):
        planned(7, CFG, 8, H100)  # 7 splits neither the batch, heads nor blocks
    model = plan.ModelSpec.from_config(CFG)
    policy = plan.DTypePolicy("fp32", "fp32", "adamw")
    with_sp = [  # sequence parallelism: the trainer's TP has none
        p for p in plan.search(model, 8, policy, H100, 4) if p.layout.sp
    ]
    assert with_sp
    with pytest.raises(ValueError, match="none of the planner's .* layouts of 4"):
        fastest_accepted(with_sp, CFG, 4, 8)
