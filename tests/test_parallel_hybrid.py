"""Hybrid parallelism on real gloo ranks: DP x TP, DP x PP and DP x TP x PP give a
TinyGPT one process's gradients and, with SGD (and AdamW for the 8 ranks), its
losses and parameters; each axis sends the wire bytes its formula says; bad
layouts are refused before any group exists. tests/controls/test_08_hybrid.py
shows the same check failing on a doubled gradient."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from distcourse.examples.gpt import GPTConfig, TinyGPT
from distcourse.launch import spawn
from distcourse.parallel import hybrid
from distcourse.parallel.hybrid.check import TOL, verdicts
from distcourse.runtime import RankError

CFG = GPTConfig()  # vocab 64, 2 blocks, 4 heads, 32 wide, 16 tokens
STEPS, BATCH = 6, 8
OPTIMIZERS = ("sgd", "adamw")


def _train(
    shape: tuple[int, int, int], micro_batches: int, optimizers: tuple[str, ...]
) -> dict[str, dict]:
    layout = hybrid.Layout(*shape)
    runs = {}
    for optimizer in optimizers:
        found = hybrid.against_one_process(
            layout,
            CFG,
            steps=STEPS,
            batch=BATCH,
            micro_batches=micro_batches,
            optimizer=optimizer,
        )
        stage = found["coordinate"]["pp"]
        held = hybrid.parameters_held(layout, CFG, stage)
        runs[optimizer] = {**found, "held_formula": held}
    return runs


@pytest.mark.parametrize(
    "shape, micro_batches, optimizers",
    [
        ((2, 1, 2), 1, ("sgd",)),
        ((2, 2, 1), 2, ("sgd",)),
        ((2, 2, 2), 2, OPTIMIZERS),
        ((4, 1, 1), 1, ("sgd",)),  # groups of 4: the ring's 2(n - 1)/n is not 1
        ((1, 1, 4), 1, ("sgd",)),
    ],
    ids=["dp2xtp2", "dp2xpp2", "dp2xpp2xtp2", "dp4", "tp4"],
)
def test_layout_equals_one_process(
    shape: tuple, micro_batches: int, optimizers: tuple[str, ...]
) -> None:
    world = shape[0] * shape[1] * shape[2]
    found = spawn(_train, world, shape, micro_batches, optimizers, timeout=90)
    for rank, runs in enumerate(found):
        for optimizer, r in runs.items():
            assert r["alone"][-1] < r["alone"][0] - 0.4  # it learns
            assert r["grad_diff"] <= TOL["gradients"], (rank, r["grad_diff"])
            assert r["loss_diff"] <= TOL["losses"], (rank, r["loss_diff"])
            assert r["param_diff"] <= TOL[optimizer], (rank, r["param_diff"])
            assert all(line.endswith(("PASS", "True")) for line in verdicts(r))
            assert r["covered"]  # every parameter of the model is on some rank
            assert r["bytes"] == r["formula"], (rank, r["bytes"], r["formula"])
            assert r["held"] == r["held_formula"]
            assert r["memory"]["params"] == 4 * r["held"]
            moments = 2 if optimizer == "adamw" else 0
            assert r["memory"]["optimizer"] == moments * r["memory"]["params"]
            assert r["memory"]["activations"] > 0


def test_layouts_of_eight_ranks() -> None:
    names = [lay.name for lay in hybrid.layouts(8)]
    assert names[0] == "8x1x1" and len(names) == len(set(names)) == 10
    assert {"2x2x2", "1x1x8", "1x8x1", "4x1x2", "2x1x4"} <= set(names)
    assert hybrid.Layout(2, 2, 2).grid() == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]


@pytest.mark.parametrize(
    "layout, cfg, options, message",
    [
        (hybrid.Layout(2, 2, 2), CFG, dict(world=4), "= 8 ranks, but the world has 4"),
        (hybrid.Layout(1, 3, 1), CFG, {}, "n_layer=2 blocks do not divide into pp=3"),
        (
            hybrid.Layout(1, 1, 3),
            GPTConfig(vocab=66, n_head=4, n_embd=36),
            {},
            "n_head=4 is not divisible by tp=3",
        ),
        (
            hybrid.Layout(1, 1, 4),
            GPTConfig(vocab=66),
            {},
            "vocab=66 is not divisible by tp=4",
        ),
        (hybrid.Layout(3, 1, 1), CFG, dict(batch=8), "does not split into dp=3"),
        (
            hybrid.Layout(2, 2, 1),
            CFG,
            dict(batch=8, micro_batches=3),
            "does not split into 3 micro-batches",
        ),
        (
            hybrid.Layout(2, 1, 1),
            CFG,
            dict(micro_batches=2),
            "micro_batches=2 needs a pipeline: pp=1",
        ),
        (hybrid.Layout(ep=4), None, dict(experts=6), "experts=6 is not divisible"),
        (hybrid.Layout(ep=2), None, dict(batch=5), "into dp=1 x ep=2 equal shares"),
        (hybrid.Layout(cp=2), None, dict(seq_len=6), "into 2 x cp=4 zig-zag"),
        (hybrid.Layout(dp=2, ep=2), None, dict(world=2), "ep=2 x tp=1 = 4 ranks"),
    ],
)
def test_bad_layouts_are_refused_naming_the_degree(
    layout: hybrid.Layout, cfg: GPTConfig, options: dict, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        hybrid.check(layout, cfg, **options)


def test_degrees_must_be_positive_integers() -> None:
    with pytest.raises(ValueError, match="tp must be a positive integer"):
        hybrid.Layout(2, 1, 0)
    with pytest.raises(ValueError, match="ep must be a positive integer"):
        hybrid.Layout(ep=0)


def test_expert_and_context_axes_join_the_layout() -> None:
    assert hybrid.Layout(2, 2, 2) == hybrid.Layout(2, 2, 2, ep=1, cp=1)
    layout = hybrid.Layout(dp=2, ep=2, cp=2)
    assert layout.world == 8 and layout.name == "2x1x1 ep2 cp2"
    assert layout.axes == (("dp", 2), ("pp", 1), ("ep", 2), ("cp", 2), ("tp", 1))
    hybrid.check(layout, world=8, batch=4, experts=4, seq_len=16)  # all fine


def _bad_mesh() -> str:
    groups = dist.distributed_c10d.get_pg_count()
    try:
        hybrid.make_mesh(hybrid.Layout(2, 2, 1), CFG)
    except ValueError as err:
        assert dist.distributed_c10d.get_pg_count() == groups  # none made
        return str(err)
    return "no error"


def test_mesh_of_the_wrong_size_is_refused_before_any_group() -> None:
    assert (
        spawn(_bad_mesh, 2, timeout=30)
        == ["layout dp=2 x pp=2 x tp=1 = 4 ranks, but the world has 2"] * 2
    )


def _wrong_axes() -> None:
    from distcourse.mesh import Mesh

    hybrid.HybridGPT(TinyGPT(CFG), Mesh((2,), ("dp",)))


def test_a_mesh_with_other_axes_is_refused() -> None:
    with pytest.raises(RankError, match="a hybrid mesh has axes"):
        spawn(_wrong_axes, 2, timeout=30)
