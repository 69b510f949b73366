"""The pictures that open a chapter's "The idea": drawn from the package's own
definitions, not measured, so they show the design a chapter then measures.

`cluster` (chapter 1: the notebook's kernel, the ranks it drives, their process
group), `ring` (ranks on a circle, each passing to its right: chapter 2's ring
all_reduce, chapter 12b's K/V), `schedule` (pipeline schedules as timelines, from
`parallel.pipeline.schedules.simulate`: equal forward and backward times on a
perfect machine), and `strategies` (the book's map: what each strategy splits
across the ranks). Chapter 8's mesh is `viz.mesh_groups`, chapter 9's "who holds
what" is `viz.who_holds`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Rectangle

from distcourse.parallel.pipeline.schedules import Schedule, simulate
from distcourse.viz.common import SMALL, finish, styled
from distcourse.viz.timing import draw_actions

COLORS = plt.get_cmap("tab10").colors


def draw_ring(
    ax: plt.Axes,
    n: int,
    labels: Sequence[str] | None = None,
    center: str = "",
) -> None:
    """Ranks 0..n-1 clockwise on a circle from the top, an arrow from each to the
    next: rank r sends to rank r + 1 and receives from rank r - 1. `labels[r]` is
    a second line in rank r's circle; `center` is written in the middle."""

    def at(angle: float) -> tuple[float, float]:
        return math.cos(angle), math.sin(angle)

    angles = [math.pi / 2 - 2 * math.pi * r / n for r in range(n)]
    gap = min(0.38, math.pi / n)  # radians the arrows keep clear of each circle
    for r, angle in enumerate(angles):
        x, y = at(angle)
        ax.add_patch(plt.Circle((x, y), 0.36, color=COLORS[r % 10], alpha=0.75))
        second = labels[r] if labels else ""
        ax.text(
            x,
            y + (0.09 if second else 0),
            f"rank {r}",
            ha="center",
            va="center",
            fontsize=SMALL + 1,
        )
        if second:
            ax.text(x, y - 0.12, second, ha="center", va="center", fontsize=SMALL)
        if n > 1:
            end = angles[(r + 1) % n] + gap - (2 * math.pi if r == n - 1 else 0)
            ax.add_patch(
                FancyArrowPatch(
                    at(angle - gap),
                    at(end),
                    arrowstyle="-|>",
                    mutation_scale=14,
                    connectionstyle="arc3,rad=-0.3",
                    color="0.3",
                )
            )
    if center:
        ax.text(0, 0, center, ha="center", va="center", fontsize=SMALL)
    ax.set_xlim(-1.4, 1.4)
    ax.set_ylim(-1.4, 1.4)
    ax.set_aspect("equal")
    ax.axis("off")


@styled
def cluster(
    n: int = 4, devices: Sequence[str] | None = None, title: str = ""
) -> Figure:
    """How this book runs `n` ranks: the notebook's kernel on top (it serves the
    rendezvous and sends each `%%ranks` cell to every rank), the ranks in a row
    (each a process of its own; `devices[r]` a second line in rank r's circle),
    and the process group below, which joins them for collectives."""
    if n < 1:
        raise ValueError(f"cluster: n must be a positive number of ranks, got {n}")
    gap = 1.3  # between the ranks' centres
    fig, ax = plt.subplots(figsize=(max(1.05 * gap * (n - 1) + 1.3, 4.6), 3.0))
    mid = (n - 1) / 2
    ax.text(
        mid * gap,
        1.5,
        "this notebook (the kernel)\nserves the rendezvous, runs %%ranks cells",
        ha="center",
        va="center",
        fontsize=SMALL + 1,
        bbox=dict(boxstyle="round,pad=0.4", fc="0.93", ec="0.4"),
    )
    for r in range(n):
        x = r * gap
        ax.add_patch(plt.Circle((x, 0.25), 0.3, color=COLORS[r % 10], alpha=0.75))
        second = f"\n{devices[r]}" if devices else ""
        ax.text(x, 0.25, f"rank {r}{second}", ha="center", va="center", fontsize=SMALL)
        ax.add_patch(
            FancyArrowPatch(
                (mid * gap + (x - mid * gap) * 0.35, 1.22),
                (x, 0.58),
                arrowstyle="-|>",
                mutation_scale=12,
                color="0.4",
            )
        )
        ax.plot([x, x], [-0.06, -0.42], color="0.4", lw=1.5)
    ax.add_patch(Rectangle((-0.35, -0.62), (n - 1) * gap + 0.7, 0.2, color="0.75"))
    ax.text(
        mid * gap,
        -0.85,
        "process group (gloo or NCCL): collectives between the ranks",
        ha="center",
        va="center",
        fontsize=SMALL + 0.5,
    )
    ax.set_xlim(-0.6, (n - 1) * gap + 0.6)
    ax.set_ylim(-1.05, 1.85)
    ax.set_aspect("equal")
    ax.axis("off")
    return finish(fig, ax, title)


@styled
def ring(
    n: int = 4,
    labels: Sequence[str] | None = None,
    center: str = "",
    title: str = "",
) -> Figure:
    """The ring of `n` ranks alone (`draw_ring`), about 3 inches square."""
    if n < 1:
        raise ValueError(f"ring: n must be a positive number of ranks, got {n}")
    fig, ax = plt.subplots(figsize=(3.2, 3.2))
    draw_ring(ax, n, labels, center)
    return finish(fig, ax, title)


def idle_share(per_rank: Sequence[Sequence[tuple[object, float, float]]]) -> float:
    """The share of the ranks' time between the step's start and end spent idle."""
    end = max((e for acts in per_rank for _, _, e in acts), default=0.0)
    busy = sum(e - s for acts in per_rank for _, s, e in acts)
    return 1 - busy / (len(per_rank) * end) if end else 0.0


@styled
def schedule(
    *schedules: Schedule,
    forward: float = 1.0,
    backward: float = 2.0,
    title: str = "",
) -> Figure:
    """Pipeline schedules as timelines on a perfect machine, one panel each, on one
    time scale so that their lengths and bubbles compare: a row per rank, a bar per
    forward (blue), backward (orange) or weight-gradient step (green), labelled
    with its micro-batch; idle time is the white between bars. Stage times as
    `schedules.simulate` takes them (a forward 1, a backward 2 by default), for a
    rank's whole share of the layers: with v stages per rank each takes 1/v."""
    if not schedules:
        raise ValueError("schedule: give at least one Schedule")
    # a rank's v stages share its layers: each takes 1/v of the times
    runs = [simulate(s, forward / s.per_rank, backward / s.per_rank) for s in schedules]
    longest = max(e for run in runs for acts in run for _, _, e in acts)
    rows = sum(s.ranks for s in schedules)
    fig, axes = plt.subplots(
        len(schedules),
        1,
        figsize=(6.8, 0.4 * rows + 0.8 * len(schedules)),
        squeeze=False,
        gridspec_kw={"height_ratios": [s.ranks for s in schedules]},
    )
    for ax, s, run in zip(axes[:, 0], schedules, runs, strict=True):
        bars = [
            [
                (a.kind + str(a.stage // s.ranks), a.micro, start, end)
                for a, start, end in acts
            ]
            for acts in run
        ]
        draw_actions(ax, bars, s.per_rank)
        ax.set_xlim(0, longest)
        stages = f", {s.per_rank} stages per rank" if s.per_rank > 1 else ""
        ax.set_title(
            f"{s.name}: {s.ranks} ranks, {s.micro_batches} micro-batches{stages}; "
            f"idle {idle_share(run):.0%}",
            fontsize=SMALL + 1,
            loc="left",
        )
    axes[-1, 0].set_xlabel(
        f"time (a forward takes {forward:g}, a backward {backward:g})"
    )
    if title:
        fig.suptitle(title)
    return finish(fig, axes[-1, 0], "")


# What each strategy splits across its ranks (True) and what every rank holds or
# processes whole (False), and the chapter that builds it.
PARTS = ("batch", "sequence", "layers", "weight\nmatrices", "model\nstate", "experts")
SPLITS = {
    "data parallel (3)": (True, False, False, False, False, False),
    "ZeRO-1, ZeRO-2 (9)": (True, False, False, False, True, False),
    "FSDP, ZeRO-3 (9)": (True, False, False, True, True, False),
    "tensor parallel (4)": (False, False, False, True, True, False),
    "pipeline parallel (5)": (False, False, True, False, True, False),
    "context parallel (12b)": (False, True, False, False, False, False),
    "expert parallel (12)": (True, False, False, False, False, True),
}


@styled
def strategies(ranks: int = 4, title: str = "") -> Figure:
    """The book's map: a row per strategy (its chapter in brackets), a column per
    thing a training step holds or processes; a bar cut into `ranks` coloured
    pieces where the strategy splits it across the ranks (each rank its piece), a
    grey bar where every rank holds or processes all of it. Model state is the
    gradients and the optimizer's state (and the weights, where they are split)."""
    fig, ax = plt.subplots(figsize=(6.8, 3.9))
    for i, (name, splits) in enumerate(SPLITS.items()):
        y = -i
        ax.text(-0.55, y, name, ha="right", va="center", fontsize=SMALL + 1)
        for j, split in enumerate(splits):
            if split:
                for r in range(ranks):
                    ax.add_patch(
                        Rectangle(
                            (j - 0.4 + 0.8 * r / ranks, y - 0.25),
                            0.8 / ranks,
                            0.5,
                            color=COLORS[r],
                            ec="white",
                        )
                    )
            else:
                ax.add_patch(Rectangle((j - 0.4, y - 0.25), 0.8, 0.5, color="0.85"))
    for j, part in enumerate(PARTS):
        ax.text(j, 0.55, part, ha="center", va="bottom", fontsize=SMALL + 0.5)
    keys = [Rectangle((0, 0), 1, 1, color=COLORS[r]) for r in range(ranks)]
    keys.append(Rectangle((0, 0), 1, 1, color="0.85"))
    names = [f"rank {r}'s part" for r in range(ranks)] + ["whole on every rank"]
    ax.legend(
        keys,
        names,
        loc="upper center",
        bbox_to_anchor=(0.5, 0.0),
        ncol=ranks + 1,
        frameon=False,
        handlelength=1.0,
        columnspacing=1.0,
    )
    ax.set_xlim(-2.9, len(PARTS) - 0.5)
    ax.set_ylim(-len(SPLITS) + 0.5, 1.4)
    ax.axis("off")
    return finish(fig, ax, title)
