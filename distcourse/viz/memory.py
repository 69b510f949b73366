"""Figures of chapter 10: loss curves side by side (fp32 against bf16), the
memory of a rank stacked by kind (parameters, gradients, optimizer, activations,
buffers), one bar per layout or model, and one step's memory over time, stacked by
kind, with the planner's moments beside it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from distcourse.viz.common import finish, styled


@styled
def loss_curves(curves: Mapping[str, Sequence[float]], title: str = "") -> Figure:
    """One line per run: the loss at each step."""
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    for (name, losses), style in zip(
        curves.items(), ("-", "--", ":", "-."), strict=False
    ):
        ax.plot(range(1, len(losses) + 1), losses, style, label=name)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend()
    return finish(fig, ax, title)


@styled
def memory_stacks(
    bars: Mapping[str, Mapping[str, float]],
    unit: str = "GB",
    limit: float | None = None,
    title: str = "",
) -> Figure:
    """A bar per name, its kinds stacked in order; `limit` (e.g. a GPU's memory)
    drawn as a dashed line."""
    fig, ax = plt.subplots(figsize=(min(6.6, 0.9 * len(bars) + 2.4), 3.6))
    kinds = list(next(iter(bars.values())))
    bottoms = [0.0] * len(bars)
    for kind in kinds:
        heights = [float(bars[name][kind]) for name in bars]
        ax.bar(list(bars), heights, bottom=bottoms, label=kind)
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    if limit is not None:
        ax.axhline(limit, ls="--", color="0.3", lw=1)
    ax.set_ylabel(unit)
    if len(bars) > 5:  # names side by side would collide
        ax.tick_params(axis="x", labelrotation=30)
    ax.legend()
    return finish(fig, ax, title)


@styled
def memory_timeline(
    series: Mapping[str, Sequence[int]],
    phases: Mapping[str, int],
    moments: Mapping[str, float] | None = None,
    unit: str = "MiB",
    scale: float = 2**20,
    title: str = "",
) -> Figure:
    """The bytes alive after each operator of a step, stacked by kind (`series`:
    kind -> bytes per operator, as `plan.phases.timeline` gives them) and their
    sum as a line; a dotted line where each phase begins (`phases`: name ->
    operator index, from the first), named above the axes; `moments` (name ->
    bytes, e.g. the planner's) as dashed levels, named on the right."""
    fig, ax = plt.subplots(figsize=(6.6, 4.4))
    steps = list(range(len(next(iter(series.values())))))
    ax.stackplot(
        steps,
        *([v / scale for v in values] for values in series.values()),
        labels=list(series),
        linewidth=0,
        step="post",
    )
    total = [sum(kind[i] for kind in series.values()) / scale for i in steps]
    ax.step(steps, total, where="post", color="0.1", lw=0.8, label="alive")
    start, top = min(phases.values()), max(total)
    above = ax.get_xaxis_transform()  # x in data, y in axes
    for row, (name, at) in enumerate(phases.items()):  # two rows: near ones apart
        ax.axvline(at - start, color="0.35", lw=0.8, ls=":")
        y = 1.01 + 0.07 * (row % 2)
        ax.text(at - start, y, name, transform=above, fontsize=9.5)
    beside = ax.get_yaxis_transform()  # x in axes, y in data
    for name, level in (moments or {}).items():
        ax.axhline(level / scale, color="0.1", lw=0.9, ls="--")
        ax.text(1.01, level / scale, name, transform=beside, fontsize=9.5, va="center")
    ax.set_xlim(0, len(steps) - 1)
    ax.set_ylim(0, top * 1.08)
    ax.set_xlabel("operator of the step")
    ax.set_ylabel(unit)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=4, fontsize=9.5)
    if title:
        ax.set_title(title, pad=26)
    return finish(fig, ax, "")
