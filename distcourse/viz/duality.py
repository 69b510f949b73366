"""Figures of forward and backward: what each conversion sends both ways.

`conversion_bytes` draws rows measured by global_tensor.duality.conversion_table:
per conversion, the wire bytes this rank sent forward and backward (chapter 2's
convention, as the ledger counts them), each bar labelled with the collective that
ran and its formula (boxing.FORMULAS), so that a reduce_scatter and an all_gather
show the same (n-1)T/n and an all_reduce the two together. Any objects with the
fields of duality.Cost will do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from distcourse.global_tensor.boxing import FORMULAS
from distcourse.viz.common import SMALL, finish, styled


@styled
def with_formulas(collectives: str) -> str:
    """'reduce_scatter + all_reduce' -> each collective followed by its formula."""
    parts = collectives.split(" + ")
    return " + ".join(f"{c} {FORMULAS[c]}" if c in FORMULAS else c for c in parts)


@styled
def conversion_bytes(costs: Sequence[Any], title: str = "") -> Figure:
    """Paired horizontal bars, one pair per conversion: forward (top) and
    backward (bottom) bytes, labelled with the collective and the gradient's
    signatures (dy arriving -> gradient leaving)."""
    fig, ax = plt.subplots(figsize=(6.8, 0.55 * len(costs) + 1.2))
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
            with_formulas(c.forward),
            va="center",
            fontsize=SMALL,
        )
        ax.text(
            c.backward_bytes + top * 0.01,
            y - 0.18,
            f"dy {c.arrives} -> {c.grad}: {with_formulas(c.backward)}",
            va="center",
            fontsize=SMALL,
        )
    ax.set_yticks(range(len(costs)), list(reversed(names)))
    ax.set_xlim(0, top * 2.3)
    ax.set_xlabel("wire bytes of one rank (T: the tensor's bytes, n: ranks)")
    ax.legend(loc="lower right")
    return finish(fig, ax, title)
