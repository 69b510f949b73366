"""distcourse.viz.schematics: the ranks and their kernel, the ring, pipeline
schedules on a perfect machine, the map of strategies."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from distcourse import viz  # noqa: E402
from distcourse.parallel.pipeline import schedules  # noqa: E402
from distcourse.viz import schematics  # noqa: E402


def test_the_cluster_joins_the_kernel_to_every_rank_and_the_ranks_below() -> None:
    fig = viz.cluster(3, ["GPU 0", "GPU 1", "GPU 2"])
    (ax,) = fig.axes
    texts = [t.get_text() for t in ax.texts]
    assert [t for t in texts if t.startswith("rank")] == [
        f"rank {r}\nGPU {r}" for r in range(3)
    ]
    assert any(t.startswith("this notebook (the kernel)") for t in texts)
    assert any(t.startswith("process group") for t in texts)
    circles = [p for p in ax.patches if type(p).__name__ == "Circle"]
    arrows = [p for p in ax.patches if type(p).__name__ == "FancyArrowPatch"]
    assert len(circles) == len(arrows) == 3
    assert len(ax.lines) == 3  # each rank down to the process group
    with pytest.raises(ValueError, match="positive number of ranks"):
        viz.cluster(0)


def test_the_ring_has_a_circle_and_an_arrow_per_rank() -> None:
    fig = viz.ring(5, [f"chunk {r}" for r in range(5)], "to the right")
    (ax,) = fig.axes
    texts = [t.get_text() for t in ax.texts]
    assert [t for t in texts if t.startswith("rank")] == [f"rank {r}" for r in range(5)]
    assert "chunk 4" in texts and "to the right" in texts
    circles = [p for p in ax.patches if type(p).__name__ == "Circle"]
    arrows = [p for p in ax.patches if type(p).__name__ == "FancyArrowPatch"]
    assert len(circles) == len(arrows) == 5
    with pytest.raises(ValueError, match="positive number of ranks"):
        viz.ring(0)


def test_a_schedule_is_drawn_as_the_simulation_runs_it() -> None:
    gpipe, ofob = schedules.gpipe(4, 8), schedules.one_f_one_b(4, 8)
    fig = viz.schedule(gpipe, ofob)
    top, bottom = fig.axes
    # the idle share printed is the formula's (p - 1) / (m + p - 1) for both
    bubble = schedules.bubble_formula(4, 8)
    assert top.get_title(loc="left") == (
        f"GPipe: 4 ranks, 8 micro-batches; idle {bubble:.0%}"
    )
    assert bottom.get_title(loc="left").startswith("1F1B: 4 ranks")
    # a bar per action, where the simulation puts it; one time scale for both
    bars = sorted((round(p.get_x(), 6), round(p.get_y() + 0.35)) for p in top.patches)
    ran = sorted(
        (round(start, 6), rank)
        for rank, acts in enumerate(schedules.simulate(gpipe))
        for _, start, _ in acts
    )
    assert bars == ran
    assert top.get_xlim() == bottom.get_xlim()


def test_interleaving_splits_a_ranks_time_across_its_stages() -> None:
    v2 = schedules.interleaved(4, 8, 2)
    fig = viz.schedule(schedules.one_f_one_b(4, 8), v2)
    title = fig.axes[1].get_title(loc="left")
    # equal work per rank: the idle share is (p - 1) / (v m + p - 1)
    assert title.endswith(f"idle {schedules.bubble_formula(4, 8, 2):.0%}")
    assert "2 stages per rank" in title
    with pytest.raises(ValueError, match="at least one Schedule"):
        viz.schedule()


def test_idle_share_counts_the_gaps_between_the_step_start_and_end() -> None:
    assert schematics.idle_share([[("F", 0.0, 1.0)], [("F", 1.0, 2.0)]]) == 0.5
    assert schematics.idle_share([[]]) == 0.0


def test_the_map_cuts_what_each_strategy_splits_and_greys_the_rest() -> None:
    fig = viz.strategies(4)
    (ax,) = fig.axes
    names = [t.get_text() for t in ax.texts]
    for name in schematics.SPLITS:
        assert name in names
    pieces = sum(4 * sum(s) + (len(s) - sum(s)) for s in schematics.SPLITS.values())
    assert len(ax.patches) == pieces
    assert schematics.SPLITS["pipeline parallel (5)"][schematics.PARTS.index("layers")]
