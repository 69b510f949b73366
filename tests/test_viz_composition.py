"""distcourse.viz.composition: chapter 13's four moves, drawn from the package's
own definitions (the stages' cut, the layout's rank numbering)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from distcourse import viz  # noqa: E402
from distcourse.parallel.hybrid import Layout  # noqa: E402
from distcourse.viz import composition  # noqa: E402


def test_the_chain_is_cut_where_the_pipeline_cuts_it() -> None:
    assert composition.layer_names(2) == ["embed", "block 0", "block 1", "head"]
    # the embeddings go with the first stage's blocks, the head with the last's
    assert composition.stage_of(4, 2) == [0, 0, 0, 1, 1, 1]
    assert composition.stage_of(4, 4) == [0, 0, 1, 2, 3, 3]
    assert composition.stage_of(4, 1) == [0] * 6


def test_every_rank_draws_its_slices_where_the_layout_numbers_it() -> None:
    dp, pp, tp, n_layer = 2, 2, 2, 4
    fig = viz.four_moves(dp, pp, tp, n_layer)
    (ax,) = fig.axes
    boxes = [p for p in ax.patches if isinstance(p, Rectangle)]
    rows = n_layer + 2
    # panel 1 one box a layer; panels 2 and 3 one per layer and TP rank of
    # replica 0; panel 4 the same for every replica
    assert len(boxes) == rows + 2 * rows * tp + dp * rows * tp
    hatched = [b for b in boxes if b.get_hatch()]
    assert len(hatched) == n_layer * tp  # the blocks, not the embeddings or head
    texts = [t.get_text() for t in ax.texts]
    grid = Layout(dp=dp, pp=pp, tp=tp).grid()
    numbers = sorted(int(t) for t in texts if t.isdigit())
    # each stage's layers name its TP ranks, once per layer in each panel
    per_layer = composition.stage_of(n_layer, pp)
    want = [r for s in per_layer for r in grid[0][s]] * 2
    want += [r for d in range(dp) for s in per_layer for r in grid[d][s]]
    assert numbers == sorted(want)
    assert set(numbers) == set(range(dp * pp * tp))  # every rank somewhere
    assert "stage 0" in texts and "stage 1" in texts
    for head in ("1. stages", "2. split matmuls", "3. recompute", "4. replicas"):
        assert any(t.startswith(head) for t in texts), head
    assert "same place: average or shard" in texts


def test_one_replica_draws_no_replica_arrow_and_a_bad_cut_is_refused() -> None:
    texts = [t.get_text() for t in viz.four_moves(1, 2, 2, 4).axes[0].texts]
    assert "same place: average or shard" not in texts
    with pytest.raises(ValueError, match="do not divide into pp=3"):
        viz.four_moves(1, 3, 1, 4)
