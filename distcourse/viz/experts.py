"""Figures of expert parallelism: who sends how many tokens to whom (the dispatch
and combine all_to_alls), and the load on each expert against its capacity.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from distcourse.viz.common import SMALL, finish, styled


def _matrix(ax: plt.Axes, rows: Sequence[Sequence[int]], title: str) -> None:
    top = max(max(row) for row in rows)
    ax.imshow(rows, cmap="Blues", vmin=0, vmax=2 * max(top, 1))  # light: text reads
    for i, row in enumerate(rows):
        for j, value in enumerate(row):
            ax.text(j, i, str(value), ha="center", va="center", fontsize=9)
    ax.set_title(title)


@styled
def dispatch_matrix(
    sent: Sequence[Sequence[int]], experts: Sequence[Sequence[int]], title: str = ""
) -> Figure:
    """Two panels: sent[s][q], the rows rank s sends to rank q in the dispatch
    all_to_all, and its transpose, the rows the combine sends back. The expert
    holders' labels name their experts (`experts[q]`)."""
    n = len(sent)
    back = [[sent[s][q] for s in range(n)] for q in range(n)]
    plain = [f"rank {q}" for q in range(n)]
    held = [",".join(map(str, e)) for e in experts]
    holders = [f"rank {q}\nexperts {held[q]}" for q in range(n)]
    # under a column the experts take a line of their own: side by side, the
    # labels of 4 ranks overlap at the column's width
    below = [f"rank {q}\nexperts\n{held[q]}" for q in range(n)]
    fig, axes = plt.subplots(1, 2, figsize=(8.5, 4.2))
    panels = (
        (sent, "dispatch: tokens to experts", below, plain),
        (back, "combine: outputs back", plain, holders),
    )
    for ax, (rows, what, to, frm) in zip(axes, panels, strict=True):
        _matrix(ax, rows, what)
        ax.set_xticks(range(n), to, fontsize=SMALL)
        ax.set_yticks(range(n), frm, fontsize=SMALL)
        ax.set_xlabel("to")
        ax.set_ylabel("from")
    if title:
        fig.suptitle(title)
    return finish(fig, axes[0], "")  # each panel has its title already


@styled
def expert_load(
    load: Sequence[int], served: Sequence[int], capacity: int, title: str = ""
) -> Figure:
    """A bar per expert: assignments served (filled) and dropped (hatched) on top,
    with the capacity (summed over the routing groups) as a line."""
    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    experts = range(len(load))
    dropped = [a - b for a, b in zip(load, served, strict=True)]
    ax.bar(experts, served, color="C0", label="served")
    ax.bar(
        experts,
        dropped,
        bottom=served,
        color="white",
        ec="C3",
        hatch="//",
        label="dropped",
    )
    ax.axhline(capacity, color="C3", ls="--", lw=1, label=f"capacity {capacity}")
    ax.set_xticks(list(experts), [f"expert {e}" for e in experts])
    ax.set_ylabel("token assignments")
    ax.legend(frameon=False)
    return finish(fig, ax, title)
