"""distcourse.viz.context: the ring, the two splits, the causal blocks per rank."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

from distcourse import viz  # noqa: E402


def test_ring_blocks_draws_the_ring_the_splits_and_the_blocks_per_rank() -> None:
    fig = viz.ring_blocks(4)
    titles = [ax.get_title() for ax in fig.axes]
    assert titles[2] == "zigzag: blocks per rank 9 9 9 9"
    assert titles[3] == "contiguous: blocks per rank 3 7 11 15"
    ring, split, zigzag, _ = fig.axes
    assert sum("rank" in t.get_text() for t in ring.texts) == 4
    assert len(split.patches) == 2 * 8  # two layouts, 8 chunks each
    assert len(zigzag.patches) == 8 * 9 // 2  # the causal blocks, diagonal included
    labels = [t.get_text() for t in split.texts if t.get_text().startswith("r")]
    assert labels[:8] == ["r0", "r1", "r2", "r3", "r3", "r2", "r1", "r0"]
