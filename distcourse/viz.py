"""Figures for the book: per-rank tensors before and after a collective, cost curves.

Every function returns a matplotlib Figure and never calls plt.show(): a notebook
displays the returned figure, a test inspects it, and the Agg backend is enough.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import torch
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle


def _label(value: float) -> str:
    return f"{value:g}" if float(value).is_integer() else f"{value:.3g}"


def _draw_ranks(ax: plt.Axes, rows: list[list[float]], norm: Normalize) -> None:
    """One row of labelled cells per rank, rank 0 on top."""
    cmap = plt.get_cmap("Blues")
    for r, row in enumerate(rows):
        for j, value in enumerate(row):
            shade = cmap(0.15 + 0.6 * norm(value))
            ax.add_patch(Rectangle((j, -r - 1), 1, 1, facecolor=shade, edgecolor="k"))
            ax.text(j + 0.5, -r - 0.5, _label(value), ha="center", va="center")
    width = max((len(row) for row in rows), default=1)
    ax.set_xlim(0, max(width, 1))
    ax.set_ylim(-len(rows), 0)
    ax.set_yticks([-r - 0.5 for r in range(len(rows))])
    ax.set_yticklabels([f"rank {r}" for r in range(len(rows))])
    ax.set_xticks([])
    ax.set_aspect("equal")
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)


def rank_tensors(
    before: Sequence[torch.Tensor], after: Sequence[torch.Tensor], title: str = ""
) -> Figure:
    """Each rank's small 1-D tensor as a row of cells, before and after a collective.

    Colours share one scale across both panels, so a reader sees values combine (an
    all_reduce makes every row equal to the sum) or spread (a broadcast).
    """
    rows = [[t.flatten().tolist() for t in side] for side in (before, after)]
    values = [v for side in rows for row in side for v in row] or [0.0]
    norm = Normalize(min(values), max(values) if max(values) > min(values) else 1.0)
    width = max((len(row) for side in rows for row in side), default=1)
    fig, axes = plt.subplots(
        1, 2, figsize=(2 * (1.2 + 0.5 * width), 0.6 + 0.45 * max(len(before), 1))
    )
    for ax, side, name in zip(axes, rows, ("before", "after"), strict=True):
        _draw_ranks(ax, side, norm)
        ax.set_title(name)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    plt.close(fig)  # the caller displays it; pyplot must not show it a second time
    return fig


def cost_plot(
    sizes: Sequence[float],
    measured: dict[str, Sequence[float]],
    predicted: dict[str, Sequence[float]],
    title: str = "",
) -> Figure:
    """Measured times (dots) against the alpha-beta prediction (dashed), log-log.

    A key present in both dicts gets one colour, so each algorithm's dots sit on (or
    off) its own line.
    """
    fig, ax = plt.subplots(figsize=(6, 4))
    colors = {}
    for name, times in measured.items():
        (dots,) = ax.loglog(sizes, times, "o", label=f"{name} measured")
        colors[name] = dots.get_color()
    for name, times in predicted.items():
        ax.loglog(sizes, times, "--", color=colors.get(name), label=f"{name} model")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("time (s)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    if title:
        ax.set_title(title)
    fig.tight_layout()
    plt.close(fig)
    return fig
