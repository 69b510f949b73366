"""Figures for the book: per-rank tensors before and after a collective, cost curves.

Every function returns a matplotlib Figure and never calls plt.show(): a notebook
displays the returned figure, a test inspects it, and the Agg backend is enough.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from textwrap import fill

import matplotlib.pyplot as plt
import torch
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from distcourse.trace import Event, as_events


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


def _finish(fig: Figure, ax: plt.Axes, title: str) -> Figure:
    """Title, tight layout, and close: the caller displays the returned figure."""
    if title:
        ax.set_title(title)
    fig.tight_layout()
    plt.close(fig)  # pyplot must not show it a second time
    return fig


def cost_plot(
    sizes: Sequence[float],
    measured: dict[str, Sequence],
    predicted: dict[str, Sequence[float]],
    title: str = "",
) -> Figure:
    """Measured times (dots) against the alpha-beta prediction (dashed), log-log.

    A key present in both dicts gets one colour, so each algorithm's dots sit on (or
    off) its own line. A measured entry may be a list of repeats per size (as
    `costmodel.measure(..., spread=True)` gives): the dot is the fastest repeat and
    a vertical bar runs to the slowest, so the spread shows.
    """
    fig, ax = plt.subplots(figsize=(6, 4))
    colors = {}
    for name, times in measured.items():
        runs = [t if isinstance(t, Sequence) else [t] for t in times]
        best = [min(r) for r in runs]
        (dots,) = ax.loglog(sizes, best, "o", label=f"{name} measured")
        colors[name] = dots.get_color()
        if any(len(r) > 1 for r in runs):
            worst = [max(r) for r in runs]
            ax.vlines(sizes, best, worst, color=colors[name], alpha=0.5)
    for name, times in predicted.items():
        ax.loglog(sizes, times, "--", color=colors.get(name), label=f"{name} model")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("time (s)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    return _finish(fig, ax, title)


# ------------------------------------------------------ data-parallel timelines ----

_COMPUTE = ("forward", "backward", "wait")  # drawn on one row: what the rank does
_KIND_COLORS = {"forward": "C0", "backward": "C2", "wait": "C3", "all_reduce": "C1"}


def timeline(
    events: Sequence[Event | tuple[str, float, float]], title: str = ""
) -> Figure:
    """One rank's step as bars in ms: compute on top, then each bucket's all-reduce.

    `events` are `Event(name, start, end)`s (e.g. `DDP.timeline`) or tuples, with
    time.perf_counter() seconds; an all-reduce's bar runs from launch to completion.
    Forward, backward and the final wait share the top row; a dotted line marks the
    end of backward, so bars that start left of it are communication overlapped with
    computation.
    """
    spans = [(e.name, e.start, e.end) for e in as_events(events)]
    t0 = min((start for _, start, _ in spans), default=0.0)
    rows = ["compute"] + sorted(
        dict.fromkeys(n for n, _, _ in spans if n not in _COMPUTE),
        key=lambda n: min(s for m, s, _ in spans if m == n),
    )
    colors = dict(_KIND_COLORS)
    for name, _, _ in spans:  # kinds beyond the usual four get the next colours
        colors.setdefault(name.split()[0], f"C{len(colors)}")
    fig, ax = plt.subplots(figsize=(7, 3.5))
    labelled: set[str] = set()
    order = {kind: i for i, kind in enumerate(colors)}  # legend: forward first
    for name, start, end in sorted(spans, key=lambda s: order[s[0].split()[0]]):
        kind = name.split()[0]
        row = rows.index("compute" if name in _COMPUTE else name)
        ax.barh(
            row, 1e3 * (end - start), left=1e3 * (start - t0), height=0.6,
            color=colors[kind], label=None if kind in labelled else kind,
        )  # fmt: skip
        labelled.add(kind)
        if name == "backward":
            ax.axvline(1e3 * (end - t0), color="k", linestyle=":", linewidth=1)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(rows)
    ax.set_ylim(len(rows) - 0.5, -0.5)  # compute on top, bucket 0 below it
    ax.set_xlabel("time since the step started (ms)")
    ax.grid(True, axis="x", alpha=0.3)
    if spans:
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
    return _finish(fig, ax, title)


def hidden_sweep(
    caps_mb: Sequence[float], shares: Sequence[Sequence[float]], title: str = ""
) -> Figure:
    """Share of all-reduce time hidden behind backward (%) against bucket size (MB).

    `shares[i]` holds the samples measured with cap `caps_mb[i]` (e.g. every rank's
    steps): a dot at their median and a bar from the smallest to the largest, so the
    spread of a timing-based measurement stays in view.
    """
    medians = [100 * statistics.median(s) for s in shares]
    below = [m - 100 * min(s) for m, s in zip(medians, shares, strict=True)]
    above = [100 * max(s) - m for m, s in zip(medians, shares, strict=True)]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.errorbar(
        caps_mb, medians, yerr=[below, above], fmt="o-", capsize=4,
        label="median; bar: smallest to largest",
    )  # fmt: skip
    ax.set_xscale("log")
    ax.set_xticks(caps_mb, [f"{cap:g}" for cap in caps_mb])
    ax.minorticks_off()
    ax.set_xlabel("bucket size (MB)")
    ax.set_ylabel("all-reduce time hidden (%)")
    ax.set_ylim(0, 100)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    return _finish(fig, ax, title)


# ------------------------------------------------------ tensor-parallel layout ----


def _blocks(
    ax: plt.Axes, shape: tuple[int, int], owners: list[str], split: int, title: str
) -> None:
    """A rows x cols matrix cut into len(owners) equal blocks along `split` (0: rows,
    1: columns), each labelled and coloured by its owner ("rank r", or "all")."""
    rows, cols = shape
    n = len(owners)
    for i, owner in enumerate(owners):
        x, y, w, h = (0, i * rows / n, cols, rows / n) if split == 0 else (
            i * cols / n, 0, cols / n, rows)  # fmt: skip
        rank = owner.split()[-1]
        color = f"C{rank}" if rank.isdigit() else "0.85"
        ax.add_patch(Rectangle((x, y), w, h, facecolor=color, alpha=0.45,
                               edgecolor="k"))  # fmt: skip
        label = owner.replace(" ", "\n") if rank.isdigit() else fill(owner, 14)
        ax.text(x + w / 2, y + h / 2, label, ha="center", va="center",
                fontsize="small")  # fmt: skip
    ax.set_xlim(0, cols)
    ax.set_ylim(rows, 0)  # row 0 on top, as a matrix is written
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(title, fontsize="medium")


def tp_layout(n: int, tokens: int = 4, in_features: int = 8, out_features: int = 8,
              title: str = "") -> Figure:  # fmt: skip
    """Who holds what in Y = X W^T on `n` ranks: column-parallel (top row: W's rows,
    Y's columns split; X on all) and row-parallel (bottom: X's columns and W's
    columns split; each rank a partial Y, summed by all_reduce). W is drawn in
    nn.Linear's (out, in) layout; colour Ck is rank k, grey is every rank."""
    if n < 1:
        raise ValueError(f"n must be a positive number of ranks, got {n}")
    ranks = [f"rank {r}" for r in range(n)]
    x, w, y = (tokens, in_features), (out_features, in_features), (tokens, out_features)
    fig, axes = plt.subplots(2, 3, figsize=(8, 5))
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


def gantt(
    per_rank: Sequence[Sequence[Event | tuple[str, float, float]]], title: str = ""
) -> Figure:
    """A pipeline step: one row per rank, a bar per action, labelled with its
    micro-batch. Events are named "F stage micro" or "B stage micro" (as
    `parallel.pipeline` records them); forwards blue, backwards orange, and with
    several stages per rank, each later stage a lighter shade."""
    ranks = [as_events(evs) for evs in per_rank]
    t0 = min((e.start for evs in ranks for e in evs), default=0.0)
    fig, ax = plt.subplots(figsize=(8, 0.5 + 0.5 * len(ranks)))
    for r, evs in enumerate(ranks):
        for e in evs:
            kind, stage, micro = e.name.split()
            shade = 1.0 - 0.45 * (int(stage) // len(ranks) > 0)
            color = "C0" if kind == "F" else "C1"
            ax.barh(r, 1e3 * e.seconds, left=1e3 * (e.start - t0), height=0.7,
                    color=color, alpha=shade, edgecolor="white")  # fmt: skip
            ax.text(1e3 * (e.start - t0 + e.seconds / 2), r, micro, ha="center",
                    va="center", fontsize=7, color="white")  # fmt: skip
    ax.set_yticks(range(len(ranks)))
    ax.set_yticklabels([f"rank {r}" for r in range(len(ranks))])
    ax.set_ylim(len(ranks) - 0.5, -0.5)
    ax.set_xlabel("time since the step started (ms)")
    ax.grid(True, axis="x", alpha=0.3)
    return _finish(fig, ax, title)


def sbp_pieces(pieces: dict[str, Sequence[torch.Tensor]], title: str = "") -> Figure:
    """What each rank holds of one logical 2-D tensor: a row per signature (name ->
    the ranks' local tensors, in rank order), one colour scale for all, so split,
    broadcast and a partial sum's zeros compare at a glance; cells show values."""
    if not pieces or not all(pieces.values()):
        raise ValueError("need at least one signature and one rank")
    values = torch.cat([t.flatten().float() for ts in pieces.values() for t in ts])
    lo, hi = (values.min().item(), values.max().item()) if values.numel() else (0, 1)
    n = max(len(ts) for ts in pieces.values())
    fig, axes = plt.subplots(len(pieces), n, figsize=(1.9 * n, 1.9 * len(pieces)),
                             squeeze=False)  # fmt: skip
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
                        ax.text(j, i, f"{v:g}", ha="center", va="center", fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    plt.close(fig)  # the caller displays it
    return fig
