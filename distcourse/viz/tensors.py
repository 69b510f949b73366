"""Figures of tensors and where their pieces live: per-rank values before and after a
collective, tensor-parallel weight layouts, and global tensors' pieces under an SBP.
"""

from __future__ import annotations

from collections.abc import Sequence
from textwrap import fill

import matplotlib.pyplot as plt
import torch
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from distcourse.viz.common import SMALL, label, styled


def _draw_ranks(ax: plt.Axes, rows: list[list[float]], norm: Normalize) -> None:
    """One row of labelled cells per rank, rank 0 on top."""
    cmap = plt.get_cmap("Blues")
    for r, row in enumerate(rows):
        for j, value in enumerate(row):
            shade = cmap(0.15 + 0.6 * norm(value))
            ax.add_patch(Rectangle((j, -r - 1), 1, 1, facecolor=shade, edgecolor="k"))
            ax.text(j + 0.5, -r - 0.5, label(value), ha="center", va="center")
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


@styled
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


def _blocks(
    ax: plt.Axes, shape: tuple[int, int], owners: list[str], split: int, title: str
) -> None:
    """A rows x cols matrix cut into len(owners) equal blocks along `split` (0: rows,
    1: columns), each labelled and coloured by its owner ("rank r", or "all")."""
    rows, cols = shape
    n = len(owners)
    for i, owner in enumerate(owners):
        x, y, w, h = (
            (0, i * rows / n, cols, rows / n)
            if split == 0
            else (i * cols / n, 0, cols / n, rows)
        )
        rank = owner.split()[-1]
        color = f"C{rank}" if rank.isdigit() else "0.85"
        ax.add_patch(
            Rectangle((x, y), w, h, facecolor=color, alpha=0.45, edgecolor="k")
        )
        text = owner.replace(" ", "\n") if rank.isdigit() else fill(owner, 14)
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=SMALL)
    ax.set_xlim(0, cols)
    ax.set_ylim(rows, 0)  # row 0 on top, as a matrix is written
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(title, fontsize="medium")


@styled
def tp_layout(
    n: int,
    tokens: int = 4,
    in_features: int = 8,
    out_features: int = 8,
    title: str = "",
) -> Figure:
    """Who holds what in Y = X W^T on `n` ranks: column-parallel (top row: W's rows,
    Y's columns split; X on all) and row-parallel (bottom: X's columns and W's
    columns split; each rank a partial Y, summed by all_reduce). W is drawn in
    nn.Linear's (out, in) layout; colour Ck is rank k, grey is every rank."""
    if n < 1:
        raise ValueError(f"n must be a positive number of ranks, got {n}")
    ranks = [f"rank {r}" for r in range(n)]
    x, w, y = (tokens, in_features), (out_features, in_features), (tokens, out_features)
    fig, axes = plt.subplots(2, 3, figsize=(6.8, 4.4))
    panels = [
        (x, ["all ranks"], 0, "X (tokens, in): whole"),
        (w, ranks, 0, "W (out, in): rows split"),
        (y, ranks, 1, "Y (tokens, out): columns split"),
        (x, ranks, 1, "X: columns split"),
        (w, ranks, 1, "W: columns split"),
        (y, ["a partial Y on every rank"], 0, "Y: all_reduce of the partials"),
    ]
    for ax, (shape, owners, split, name) in zip(axes.flat, panels, strict=True):
        _blocks(ax, shape, owners, split, name)
    axes[0, 0].set_ylabel("column-parallel")
    axes[1, 0].set_ylabel("row-parallel")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    plt.close(fig)
    return fig


@styled
def sbp_pieces(pieces: dict[str, Sequence[torch.Tensor]], title: str = "") -> Figure:
    """What each rank holds of one logical 2-D tensor: a row per signature (name ->
    the ranks' local tensors, in rank order), one colour scale for all, so split,
    broadcast and a partial sum's zeros compare at a glance; cells show values."""
    if not pieces or not all(pieces.values()):
        raise ValueError("need at least one signature and one rank")
    values = torch.cat([t.flatten().float() for ts in pieces.values() for t in ts])
    lo, hi = (values.min().item(), values.max().item()) if values.numel() else (0, 1)
    n = max(len(ts) for ts in pieces.values())
    fig, axes = plt.subplots(
        len(pieces), n, figsize=(1.65 * n, 1.65 * len(pieces)), squeeze=False
    )
    for row, (name, ts) in zip(axes, pieces.items(), strict=True):
        row[0].set_ylabel(name)
        for r, (ax, t) in enumerate(zip(row, ts, strict=False)):
            ax.set(xticks=[], yticks=[], title=f"rank {r}: {tuple(t.shape)}")
            if t.numel():
                grid = t.reshape(t.shape[0], -1)  # light colours: legible values
                ax.imshow(grid.numpy(), cmap="Blues", vmin=lo, vmax=2 * hi - lo)
                grid = grid.tolist()
                for i, line in enumerate(grid):
                    for j, v in enumerate(line):
                        ax.text(
                            j, i, f"{v:g}", ha="center", va="center", fontsize=SMALL
                        )
    fig.suptitle(title)
    fig.tight_layout()
    plt.close(fig)  # the caller displays it
    return fig
