"""Figures of sharded model state: who holds what under DP, ZeRO-1, ZeRO-2 and ZeRO-3,
and the trade of memory held for bytes sent.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from distcourse.viz.common import finish, styled

KINDS = ("parameters", "gradients", "optimizer state")
_COLORS = ("C0", "C1", "C2")
# which kinds each stage shards (True) or keeps whole on every rank (False)
STAGES = {
    "DP": (False, False, False),
    "ZeRO-1": (False, False, True),
    "ZeRO-2": (False, True, True),
    "ZeRO-3 / FSDP": (True, True, True),
}
_WIDTH = (1.0, 1.0, 2.0)  # fp32 AdamW: 4, 4 and 8 bytes per parameter


@styled
def who_holds(world: int) -> Figure:
    """A panel per stage; a row per rank; each kind a bar as long as its bytes, drawn
    whole where every rank holds all of it, as the rank's 1/N slice where sharded."""
    fig, axes = plt.subplots(1, len(STAGES), figsize=(2.3 * len(STAGES), 2.4))
    for ax, (stage, sharded) in zip(axes, STAGES.items(), strict=True):
        for rank in range(world):
            start = 0.0
            for split, width, color in zip(sharded, _WIDTH, _COLORS, strict=True):
                if split:
                    piece = width / world
                    ax.barh(-rank, piece, left=start + rank * piece, color=color)
                    ax.barh(-rank, width, left=start, fill=False, ec="0.8", lw=0.5)
                else:
                    ax.barh(-rank, width, left=start, color=color)
                start += width + 0.15
        ax.set_yticks([-r for r in range(world)], [f"rank {r}" for r in range(world)])
        ax.set_xticks([])
        ax.set_title(stage)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in _COLORS]
    fig.legend(handles, KINDS, loc="lower center", ncol=3, frameon=False)
    fig.tight_layout(rect=(0, 0.1, 1, 1))  # room for the legend below the panels
    plt.close(fig)
    return fig


@styled
def memory_for_communication(
    names: Sequence[str], held: Sequence[int], sent: Sequence[int], title: str = ""
) -> Figure:
    """Each strategy as a point: bytes a rank holds against bytes it sends a step."""
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for i, (name, h, s) in enumerate(zip(names, held, sent, strict=True)):
        ax.scatter(s, h, color=f"C{i}", s=60)
        ax.annotate(name, (s, h), textcoords="offset points", xytext=(6, 4))
    ax.set_xlabel("bytes sent per rank per step")
    ax.set_ylabel("bytes held per rank")
    ax.set_xlim(0, 1.25 * max(sent))
    ax.set_ylim(0, 1.2 * max(held))
    return finish(fig, ax, title)


@styled
def bytes_against_ranks(
    worlds: Sequence[int],
    measured: dict[str, Sequence[int]],
    formula: dict[str, Sequence[int]],
    title: str = "",
) -> Figure:
    """Bytes a rank holds against the number of ranks, one line per strategy: the
    formula as a line, what was measured as dots on it."""
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for i, name in enumerate(measured):
        ax.plot(worlds, formula[name], color=f"C{i}", label=f"{name} (formula)")
        ax.scatter(worlds, measured[name], color=f"C{i}", s=40, zorder=3)
    ax.set_xticks(list(worlds))
    ax.set_xlabel("ranks N")
    ax.set_ylabel("bytes held per rank (dots: measured)")
    ax.set_ylim(0, 1.1 * max(max(v) for v in formula.values()))
    ax.legend()
    return finish(fig, ax, title)
