"""hybrid.recipe: the numbers come from cost.py, the links from the grid, the
activations and the bubble from their papers' formulas; the rule picks data
parallelism for a model that fits a GPU, and for one that does not the least model
parallelism that fits, then the fewest modelled seconds (in process: no ranks)."""

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


def _seconds(r: dict) -> float:
    return sum(r["seconds"].values())


def test_a_model_that_does_not_fit_takes_the_least_split_then_the_fewest_seconds() -> (
    None
):
    found = recipe.rows(LARGE, BATCH, WORLD, recipe.DGX_H100)
    by_name = {r["layout"]: r for r in found}
    assert not by_name["64x1x1"]["fits"]
    assert by_name["8x8x1"]["memory_gib"]["params"] * 16 / 4 < 74.5  # state fits,
    assert not by_name["8x8x1"]["fits"]  # but 1F1B's first stage holds L blocks
    best = recipe.choose(found)
    eights = [r for r in found if r["fits"] and r["layout"].endswith(("x2x4", "x1x8"))]
    assert best == min(eights, key=_seconds) and best["layout"] == "8x2x4"
    assert recipe.summary(best).endswith(
        "with activations; dp network, pp node, tp node"
    )
    fastest = recipe.choose(found, rule=False)  # more split: fewer modelled seconds
    assert fastest == min((r for r in found if r["fits"]), key=_seconds)
    assert fastest["layout"] == "4x8x2"


def test_activations_and_bubble_follow_their_formulas() -> None:
    layout, machine = hybrid.Layout(4, 8, 2), recipe.DGX_H100
    s, h, a, L = 2048, 6144, 48, 48  # Korthikanti et al. eq. 5, t = 2, 16 bits
    assert recipe.activations(layout, LARGE) == int(
        L * s * h * (34 + 5 * a * s / h) / 2
    )
    compute = 6 * hybrid.parameters_held(hybrid.Layout(1, 1, 1), LARGE, 0)
    compute *= BATCH * s / (WORLD * 989e12 * recipe.MFU)
    assert recipe.compute_seconds(LARGE, BATCH, WORLD, machine) == pytest.approx(
        compute
    )
    (row,) = [
        r for r in recipe.rows(LARGE, BATCH, WORLD, machine) if r["layout"] == "4x8x2"
    ]
    assert row["seconds"]["bubble"] == pytest.approx(compute * 7 / (BATCH // 4))
    (flat,) = [
        r for r in recipe.rows(LARGE, BATCH, WORLD, machine) if r["layout"] == "32x1x2"
    ]
    assert flat["seconds"]["bubble"] == 0 and flat["seconds"]["dp"] == 0  # hidden
    assert flat["bytes"]["tp"] == max(  # activations in bf16 on the wire
        hybrid.bytes_per_step(hybrid.Layout(32, 1, 2), LARGE, BATCH, 0, act_bytes=2)[k]
        for k in ("tp",)
    )


def test_rows_hold_cost_formulas_and_the_grid_links() -> None:
    (row,) = [
        r
        for r in recipe.rows(SMALL, BATCH, WORLD, recipe.DGX_H100)
        if r["layout"] == "4x4x4"
    ]
    layout = hybrid.Layout(4, 4, 4)
    held = hybrid.parameters_held(layout, SMALL, 0)  # stage 0: embeddings
    assert row["memory_gib"]["adamw"] * recipe.GIB == 8 * held
    per_stage = [
        hybrid.bytes_per_step(layout, SMALL, BATCH, s, act_bytes=2) for s in range(4)
    ]
    assert row["bytes"]["tp"] == max(b["tp"] for b in per_stage)
    assert row["links"] == dict(dp="network", pp="network", tp="node")


def test_nothing_fits_is_an_error() -> None:
    tiny = recipe.Machine("a small GPU", 8, 0.001, 100, 10, 100)
    with pytest.raises(ValueError, match="no layout holds the model"):
        recipe.choose(recipe.rows(SMALL, BATCH, WORLD, tiny))


def test_a_machine_without_its_peak_cannot_time_a_bubble() -> None:
    unknown = recipe.Machine("a GPU of unknown speed", 8, 80, 450, 50)
    with pytest.raises(ValueError, match="no tflops given"):
        recipe.rows(SMALL, BATCH, WORLD, unknown)


def test_the_table_is_a_row_per_layout_with_its_numbers_in_both_forms() -> None:
    found = recipe.rows(SMALL, BATCH, WORLD, recipe.DGX_H100)[:3]
    table = recipe.table(found)
    units, *lines = str(table).splitlines()  # what the columns count, in
    assert "GiB" in units and "MB" in units  # a caption: the headers are short
    assert len(lines) == 1 + len(found)  # the header, then a line per layout
    assert lines[0].split()[:5] == ["layout", "state", "acts", "fits", "dp"]
    for line, r in zip(lines[1:], found, strict=True):
        cells = line.split()
        assert cells[0] == r["layout"] and cells[3] == str(r["fits"])
        assert cells[-1] == f"{1e3 * _seconds(r):,.0f}"  # the step's modelled ms
    html = table.html()  # the book's form: a <tr> for the header and each row
    assert html.count("<tr") == 1 + len(found) and r["layout"] in html
