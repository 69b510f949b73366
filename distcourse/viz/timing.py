"""Figures of time: cost curves, per-rank timelines, overlap sweeps, pipeline Gantt
charts, all drawn from measured events.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from distcourse.trace import Event, as_events
from distcourse.viz.common import SMALL, finish, styled


@styled
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
    ax.legend()
    return finish(fig, ax, title)


# ------------------------------------------------------ data-parallel timelines ----


_COMPUTE = ("forward", "backward", "wait")  # drawn on one row: what the rank does
_KIND_COLORS = {"forward": "C0", "backward": "C2", "wait": "C3", "all_reduce": "C1"}


@styled
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
            row,
            1e3 * (end - start),
            left=1e3 * (start - t0),
            height=0.6,
            color=colors[kind],
            label=None if kind in labelled else kind,
        )
        labelled.add(kind)
        if name == "backward":
            ax.axvline(1e3 * (end - t0), color="k", linestyle=":", linewidth=1)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(rows)
    ax.set_ylim(len(rows) - 0.5, -0.5)  # compute on top, bucket 0 below it
    ax.set_xlabel("time since the step started (ms)")
    ax.grid(True, axis="x", alpha=0.3)
    if spans:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1))
    return finish(fig, ax, title)


@styled
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
        caps_mb,
        medians,
        yerr=[below, above],
        fmt="o-",
        capsize=4,
        label="median; bar: smallest to largest",
    )
    ax.set_xscale("log")
    ax.set_xticks(caps_mb, [f"{cap:g}" for cap in caps_mb])
    ax.minorticks_off()
    ax.set_xlabel("bucket size (MB)")
    ax.set_ylabel("all-reduce time hidden (%)")
    ax.set_ylim(0, 100)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return finish(fig, ax, title)


# ------------------------------------------------------ tensor-parallel layout ----


def draw_actions(
    ax: plt.Axes,
    per_rank: Sequence[Sequence[tuple[str, int, float, float]]],
    stages_per_rank: int = 1,
) -> None:
    """Pipeline actions as bars, one row per rank, rank 0 on top: each item is
    (kind, micro-batch, start, end) with kind "F", "B" or "W" (forwards blue,
    backwards orange, ZB-H1's weight gradients green; a rank's later stages in a
    lighter shade when `stages_per_rank` > 1, kind then "F1" for its second
    stage). A bar wide enough for it carries its micro-batch's number."""
    ends = [end for acts in per_rank for *_, end in acts]
    starts = [start for acts in per_rank for _, _, start, _ in acts]
    span = (max(ends) - min(starts)) if ends else 1.0
    for r, actions in enumerate(per_rank):
        for kind, micro, start, end in actions:
            later = len(kind) > 1 and kind[1:] != "0"
            ax.barh(
                r,
                end - start,
                left=start,
                height=0.7,
                color={"F": "C0", "B": "C1"}.get(kind[0], "C2"),
                alpha=0.55 if later else 1.0,
                edgecolor="white",
            )
            if (end - start) >= 0.022 * span:  # room for a digit or two
                ax.text(
                    (start + end) / 2,
                    r,
                    str(micro),
                    ha="center",
                    va="center",
                    fontsize=SMALL,
                    color="black" if later else "white",
                )
    ax.set_yticks(range(len(per_rank)))
    ax.set_yticklabels([f"rank {r}" for r in range(len(per_rank))])
    ax.set_ylim(len(per_rank) - 0.5, -0.5)
    ax.grid(True, axis="x", alpha=0.3)


@styled
def gantt(
    per_rank: Sequence[Sequence[Event | tuple[str, float, float]]], title: str = ""
) -> Figure:
    """A pipeline step as it ran: one row per rank, a bar per action, labelled with
    its micro-batch (`draw_actions`). Events are named "F stage micro", "B stage
    micro" or "W stage micro" (as `parallel.pipeline` records them), in seconds."""
    ranks = [as_events(evs) for evs in per_rank]
    t0 = min((e.start for evs in ranks for e in evs), default=0.0)
    n = len(ranks)
    bars = []
    for evs in ranks:
        row = []
        for e in evs:
            kind, stage, micro = e.name.split()
            shade = str(int(stage) // n) if n else "0"
            row.append(
                (kind + shade, int(micro), 1e3 * (e.start - t0), 1e3 * (e.end - t0))
            )
        bars.append(row)
    fig, ax = plt.subplots(figsize=(8, 0.5 + 0.5 * len(ranks)))
    draw_actions(ax, bars)
    ax.set_xlabel("time since the step started (ms)")
    return finish(fig, ax, title)
