"""Context parallelism in pictures: the ring of K/V chunks, the two ways to split a
sequence, and which blocks of a causal score matrix each rank computes."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from distcourse.parallel.context import LAYOUTS, chunk_ids, work_blocks
from distcourse.viz.common import SMALL, styled
from distcourse.viz.schematics import draw_ring

COLORS = plt.get_cmap("tab10").colors


def _owners(cp: int, layout: str) -> list[int]:
    """The rank that holds each of the 2·cp chunks."""
    owner = [0] * (2 * cp)
    for rank in range(cp):
        for i in chunk_ids(cp, rank, layout):
            owner[i] = rank
    return owner


def _split(ax: plt.Axes, cp: int) -> None:
    """One bar per layout: the 2·cp chunks of the sequence, coloured by owner."""
    for row, layout in enumerate(LAYOUTS):
        for i, rank in enumerate(_owners(cp, layout)):
            ax.add_patch(Rectangle((i, -row), 1, 0.8, color=COLORS[rank], alpha=0.85))
            ax.text(
                i + 0.5,
                -row + 0.4,
                f"r{rank}",
                ha="center",
                va="center",
                fontsize=SMALL,
            )
        ax.text(-0.2, -row + 0.4, layout, ha="right", va="center")
    ax.set_xlim(-2.6, 2 * cp + 0.1)
    ax.set_ylim(-1.2, 1.1)
    ax.set_xticks([i + 0.5 for i in range(2 * cp)], [str(i) for i in range(2 * cp)])
    ax.set_yticks([])
    ax.set_xlabel("chunk of the sequence (T / 2cp tokens each)")
    ax.tick_params(axis="x", length=0)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    ax.set_title("who holds which tokens")


def _blocks(ax: plt.Axes, cp: int, layout: str) -> None:
    """The causal score matrix in c x c blocks, each coloured by the rank that
    computes it (the owner of its queries); the diagonal blocks half-masked."""
    owner, n = _owners(cp, layout), 2 * cp
    for i in range(n):  # query chunk: a row
        for j in range(i + 1):  # key chunk at or before it
            alpha = 0.45 if i == j else 0.85
            ax.add_patch(
                Rectangle(
                    (j, n - 1 - i),
                    1,
                    1,
                    color=COLORS[owner[i]],
                    alpha=alpha,
                    ec="white",
                )
            )
    ax.set_xlim(0, n)
    ax.set_ylim(0, n)
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_xlabel("keys →")
    ax.set_ylabel("← queries")
    counts = " ".join(str(work_blocks(cp, r, layout)) for r in range(cp))
    ax.set_title(f"{layout}: blocks per rank {counts}")


@styled
def ring_blocks(cp: int = 4, title: str = "") -> Figure:
    """The ring, the zig-zag and contiguous splits (top), and the causal blocks
    each rank computes under either (bottom; counts from `context.work_blocks`),
    for `cp` ranks; sized for the book's column."""
    fig = plt.figure(figsize=(6.8, 5.8), layout="constrained")
    top, bottom = fig.subfigures(2, 1, height_ratios=(1, 1.15))
    ring, split = top.subplots(1, 2, width_ratios=(1, 1.4))
    held = [", ".join(map(str, chunk_ids(cp, r))) for r in range(cp)]
    draw_ring(ring, cp, [f"Q {q}" for q in held], "K, V\nto the right,\ncp − 1 steps")
    ring.set_title("the ring (zig-zag queries)")
    _split(split, cp)
    for ax, layout in zip(bottom.subplots(1, 2), LAYOUTS, strict=True):
        _blocks(ax, cp, layout)
    if title:
        fig.suptitle(title)
    plt.close(fig)  # the caller displays it
    return fig
