"""Figures of chapter 10: loss curves side by side (fp32 against bf16), and the
memory of a rank stacked by kind (parameters, gradients, optimizer, activations,
buffers), one bar per layout or model.
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
