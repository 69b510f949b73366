"""Context parallelism in pictures: the ring of K/V chunks, the two ways to split a
sequence, and which blocks of a causal score matrix each rank computes."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Rectangle

from distcourse.parallel.context import LAYOUTS, chunk_ids, work_blocks
from distcourse.viz.common import finish

COLORS = plt.get_cmap("tab10").colors


def _owners(cp: int, layout: str) -> list[int]:
    """The rank that holds each of the 2·cp chunks."""
    owner = [0] * (2 * cp)
    for rank in range(cp):
        for i in chunk_ids(cp, rank, layout):
            owner[i] = rank
    return owner


def _ring(ax: plt.Axes, cp: int) -> None:
    """Ranks on a circle; K/V chunks move one rank to the right per step."""

    def at(angle: float) -> tuple[float, float]:
        return math.cos(angle), math.sin(angle)

    angles = [math.pi / 2 - 2 * math.pi * r / cp for r in range(cp)]  # clockwise
    gap = 0.3  # radians the arrows keep clear of each circle
    for r, angle in enumerate(angles):
        x, y = at(angle)
        ax.add_patch(plt.Circle((x, y), 0.28, color=COLORS[r], alpha=0.85))
        i, j = chunk_ids(cp, r)
        ax.text(x, y + 0.05, f"rank {r}", ha="center", va="center", fontsize=9)
        ax.text(x, y - 0.1, f"Q {i}, {j}", ha="center", va="center", fontsize=8)
        arrow = FancyArrowPatch(
            at(angle - gap),
            at(angles[(r + 1) % cp] + gap - (2 * math.pi if r == cp - 1 else 0)),
            arrowstyle="-|>",
            mutation_scale=14,
            connectionstyle="arc3,rad=-0.3",
            color="0.3",
        )
        ax.add_patch(arrow)
    ax.text(
        0, 0, "K, V\nto the right,\ncp − 1 steps", ha="center", va="center", fontsize=8
    )
    ax.set_xlim(-1.45, 1.45)
    ax.set_ylim(-1.45, 1.45)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title("the ring (zig-zag queries)")


def _split(ax: plt.Axes, cp: int) -> None:
    """One bar per layout: the 2·cp chunks of the sequence, coloured by owner."""
    for row, layout in enumerate(LAYOUTS):
        for i, rank in enumerate(_owners(cp, layout)):
            ax.add_patch(Rectangle((i, -row), 1, 0.8, color=COLORS[rank], alpha=0.85))
            ax.text(
                i + 0.5, -row + 0.4, f"r{rank}", ha="center", va="center", fontsize=8
            )
        ax.text(-0.2, -row + 0.4, layout, ha="right", va="center", fontsize=9)
    ax.set_xlim(-2.6, 2 * cp + 0.1)
    ax.set_ylim(-1.2, 1.1)
    ax.set_xticks([i + 0.5 for i in range(2 * cp)], [str(i) for i in range(2 * cp)])
    ax.set_yticks([])
    ax.set_xlabel("chunk of the sequence (T / 2cp tokens each)")
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
    ax.set_title(f"{layout}: blocks per rank {counts}", fontsize=10)


def ring_blocks(cp: int = 4, title: str = "") -> Figure:
    """The ring, the zig-zag and contiguous splits, and the causal blocks each rank
    computes under either (counts from `context.work_blocks`), for `cp` ranks."""
    fig, axes = plt.subplots(
        1, 4, figsize=(15, 3.8), gridspec_kw={"width_ratios": [1, 1.5, 1, 1]}
    )
    _ring(axes[0], cp)
    _split(axes[1], cp)
    for ax, layout in zip(axes[2:], LAYOUTS, strict=True):
        _blocks(ax, cp, layout)
    return finish(fig, axes[0], title or axes[0].get_title())
