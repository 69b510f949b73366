"""Figures of forward and backward: what each conversion sends both ways.

`conversion_bytes` draws rows measured by global_tensor.duality.conversion_table:
per conversion, the bytes this rank sent forward and backward, each bar labelled
with the collective that ran. Any objects with the fields of duality.Cost will do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from distcourse.viz.common import finish


def conversion_bytes(costs: Sequence[Any], title: str = "") -> Figure:
    """Paired horizontal bars, one pair per conversion: forward (top) and
    backward (bottom) bytes, labelled with the collective and the gradient's
    signatures (dy arriving -> gradient leaving)."""
    fig, ax = plt.subplots(figsize=(7.5, 0.55 * len(costs) + 1.2))
    top = max([1] + [max(c.forward_bytes, c.backward_bytes) for c in costs])
    names = []
    for i, c in enumerate(costs):
        y = len(costs) - 1 - i
        names.append(f"{c.src} -> {c.dst}")
        ax.barh(
            y + 0.18,
            c.forward_bytes,
            height=0.34,
            color="tab:blue",
            label="forward" if i == 0 else None,
        )
        ax.barh(
            y - 0.18,
            c.backward_bytes,
            height=0.34,
            color="tab:orange",
            label="backward" if i == 0 else None,
        )
        ax.text(
            c.forward_bytes + top * 0.01,
            y + 0.18,
            f"{c.forward}",
            va="center",
            fontsize=8,
        )
        ax.text(
            c.backward_bytes + top * 0.01,
            y - 0.18,
            f"dy {c.arrives} -> {c.grad}: {c.backward}",
            va="center",
            fontsize=8,
        )
    ax.set_yticks(range(len(costs)), list(reversed(names)))
    ax.set_xlim(0, top * 1.9)
    ax.set_xlabel("bytes sent by one rank")
    ax.legend(loc="lower right")
    return finish(fig, ax, title)
