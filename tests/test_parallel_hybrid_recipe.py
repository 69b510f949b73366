"""hybrid.recipe: the numbers come from cost.py, the links from the grid, and the
rule picks data parallelism for a model whose state fits a GPU, TP up to a node
for one that does not (in process: no ranks)."""

from __future__ import annotations

import pytest

from distcourse.examples.gpt import GPTConfig
from distcourse.parallel import hybrid
from distcourse.parallel.hybrid import recipe

SMALL = GPTConfig(vocab=51200, block_size=2048, n_layer=24, n_head=16, n_embd=2048)
LARGE = GPTConfig(vocab=51200, block_size=2048, n_layer=48, n_head=48, n_embd=6144)
BATCH, WORLD = 512, 64


def test_a_model_that_fits_one_gpu_is_trained_by_data_parallelism() -> None:
    found = recipe.rows(SMALL, BATCH, WORLD, recipe.DGX_H100)
    assert recipe.choose(found)["layout"] == "64x1x1"


def test_a_model_that_does_not_fit_takes_tp_up_to_the_node_first() -> None:
    found = recipe.rows(LARGE, BATCH, WORLD, recipe.DGX_H100)
    best = recipe.choose(found)
    assert best["layout"] == "8x1x8" and best["links"]["tp"] == "node"
    assert recipe.summary(best).endswith("GiB per GPU; dp network, pp -, tp node")
    assert not next(r for r in found if r["layout"] == "64x1x1")["fits"]


def test_rows_hold_cost_formulas_and_the_grid_links() -> None:
    (row,) = [
        r
        for r in recipe.rows(SMALL, BATCH, WORLD, recipe.DGX_H100)
        if r["layout"] == "4x4x4"
    ]
    layout = hybrid.Layout(4, 4, 4)
    held = hybrid.parameters_held(layout, SMALL, 0)  # stage 0: embeddings
    assert row["memory_gib"]["adamw"] * recipe.GIB == 8 * held
    per_stage = [hybrid.bytes_per_step(layout, SMALL, BATCH, s) for s in range(4)]
    assert row["bytes"]["tp"] == max(b["tp"] for b in per_stage)
    assert row["links"] == dict(dp="network", pp="network", tp="node")


def test_nothing_fits_is_an_error() -> None:
    tiny = recipe.Machine("a small GPU", 8, 0.001, 100, 10)
    with pytest.raises(ValueError, match="no layout holds the model state"):
        recipe.choose(recipe.rows(SMALL, BATCH, WORLD, tiny))
