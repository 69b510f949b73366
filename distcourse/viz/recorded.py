"""Chapter 11 in a picture: each rank's recorded calls side by side, each message
joined to the receive that took it, and the place where the ranks part.

The calls are the lines the flight recorder writes (`comm.recorder.Entry.describe`,
what `labs.Report.columns()` returns per rank): "#3 isend float32[2, 4] to rank 1
(32 B), returned". `parse` reads one back; the test holds it to `describe`.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Patch

from distcourse.viz.common import SMALL, finish, styled

_LINE = re.compile(
    r"^#(?P<seq>\d+) (?P<op>\w+) (?P<tensor>.*?)"
    r"(?: (?P<way>to|from) rank (?P<peer>\d+))? \((?P<bytes>[\d,]+) B\), "
    r"(?P<state>returned|entered|never returned)$"
)
RED = "#c62828"
NOTHING = "no call recorded"  # a lane of a rank that made no call (labs.report)
_COLOR = {"collective": "#d6e6f5", "send": "#d9f0d3", "recv": "#fde0c5"}


@dataclass(frozen=True)
class Call:
    """One recorded call: its number on its rank, op, tensor, peer and state."""

    seq: int
    op: str
    tensor: str
    kind: str  # "collective", "send" or "recv"
    peer: int | None
    returned: bool

    def label(self) -> str:
        """What its box says: '#2 all_reduce [8, 4]', '#3 isend → rank 1'."""
        if self.kind == "collective":  # the shape alone: '[8, 4]', or 'scalar'
            shape = re.sub(r"^\w+(?=\[)", "", self.tensor)
            return f"#{self.seq} {self.op} {'scalar' if shape == '[]' else shape}"
        arrow = "→" if self.kind == "send" else "←"
        return f"#{self.seq} {self.op} {arrow} rank {self.peer}"


def parse(line: str) -> Call:
    """A recorder line back as a Call (ValueError if it is not one)."""
    found = _LINE.match(line.strip())
    if not found:
        raise ValueError(f"not a recorded call: {line!r}")
    way, peer = found["way"], found["peer"]
    kind = {"to": "send", "from": "recv"}.get(way or "", "collective")
    return Call(
        int(found["seq"]),
        found["op"],
        found["tensor"],
        kind,
        int(peer) if peer is not None else None,
        found["state"] == "returned",
    )


def parting(lanes: Sequence[Sequence[Call]]) -> list[tuple[int, int]]:
    """Where the ranks part: (rank, row) of each rank's first collective whose op
    or tensor differs across the ranks (or that some rank never entered); [] when
    every rank made the same collectives."""
    found = [
        [(r, i, c) for i, c in enumerate(lane) if c.kind == "collective"]
        for r, lane in enumerate(lanes)
    ]
    for k in range(max((len(f) for f in found), default=0)):
        calls = [f[k] if k < len(f) else None for f in found]
        if len({(c[2].op, c[2].tensor) if c else None for c in calls}) > 1:
            return [(rank, row) for rank, row, _ in filter(None, calls)]
    return []


def pairs(lanes: Sequence[Sequence[Call]]) -> tuple[list, list]:
    """Sends joined to their receives ((src, row), (dst, row)), and the sends no
    receive took (src, row, dst): the k-th send from s to d pairs with d's k-th
    receive from s, the order in which both backends match messages."""
    sends: dict[tuple[int, int], list[int]] = defaultdict(list)
    recvs: dict[tuple[int, int], list[int]] = defaultdict(list)
    for rank, lane in enumerate(lanes):
        for row, c in enumerate(lane):
            if c.kind == "send" and c.peer is not None:
                sends[(rank, c.peer)].append(row)
            elif c.kind == "recv" and c.peer is not None:
                recvs[(c.peer, rank)].append(row)
    joined, lost = [], []
    for (src, dst), rows in sorted(sends.items()):
        took = recvs.get((src, dst), [])
        for k, row in enumerate(rows):
            if k < len(took):
                joined.append(((src, row), (dst, took[k])))
            else:
                lost.append((src, row, dst))
    return joined, lost


def _box(ax: plt.Axes, x: float, y: float, half: float, **style: object) -> None:
    """A rounded box centred on (x, y), `half` wide on each side, 0.64 high
    (0.8 when it outlines others: `half` above 0.45)."""
    high = 0.4 if half > 0.45 else 0.32
    ax.add_patch(
        FancyBboxPatch(
            (x - half, y - high),
            2 * half,
            2 * high,
            boxstyle="round,pad=0,rounding_size=0.08",
            **style,
        )
    )


def _arrow(ax: plt.Axes, start: tuple, end: tuple, color: str, lw: float) -> None:
    ax.add_patch(
        FancyArrowPatch(
            start, end, arrowstyle="-|>", mutation_scale=10, color=color, lw=lw
        )
    )


@styled
def calls(by_rank: Sequence[Sequence[str]], title: str = "") -> Figure:
    """A lane per rank, its calls downwards in the order it entered them: blue a
    collective, green a send, orange a receive; a red border on a call that never
    returned. An arrow joins each send to the receive that took it; a send that
    no receive took has a red dashed outline and a red stub. The first collective
    the ranks call differently is outlined in red ("the ranks part here")."""
    lanes = [[parse(x) for x in lane if x != NOTHING] for lane in by_rank]
    n, rows = len(lanes), max((len(lane) for lane in lanes), default=1)
    fig, ax = plt.subplots(
        figsize=(min(6.8, max(4.4, 1.7 * n + 0.4)), 0.42 * rows + 1.0)
    )
    for rank, lane in enumerate(lanes):
        for row, c in enumerate(lane):
            stuck = not c.returned
            _box(
                ax,
                rank,
                -row,
                0.42,
                fc=_COLOR[c.kind],
                ec=RED if stuck else "0.55",
                lw=2.0 if stuck else 0.8,
            )
            ax.text(rank, -row, c.label(), ha="center", va="center", fontsize=SMALL)
    joined, lost = pairs(lanes)
    for (src, a), (dst, b) in joined:
        side = 1 if dst > src else -1
        _arrow(ax, (src + 0.42 * side, -a), (dst - 0.42 * side, -b), "0.35", 1.0)
    for src, row, dst in lost:  # a red dashed outline, a red stub towards dst
        side = 1 if dst > src else -1
        _box(ax, src, -row, 0.42, fill=False, ec=RED, ls="--", lw=1.5)
        _arrow(ax, (src + 0.42 * side, -row), (src + 0.56 * side, -row), RED, 1.2)
    part = parting(lanes)
    for rank, row in part:
        _box(ax, rank, -row, 0.48, fill=False, ec=RED, ls="--", lw=1.5)
    if part:
        rank, row = part[-1]
        ax.text(
            rank + 0.48,
            -row - 0.45,
            "the ranks part here",
            ha="right",
            va="top",
            color=RED,
            fontsize=SMALL,
        )
    kinds = {c.kind for lane in lanes for c in lane}
    keys = [
        Patch(fc=_COLOR[kind], ec="0.55", label=name)
        for kind, name in (
            ("collective", "collective"),
            ("send", "send"),
            ("recv", "receive"),
        )
        if kind in kinds
    ]
    keys.append(Patch(fc="white", ec=RED, lw=2, label="never returned"))
    if lost:
        keys.append(Patch(fc="white", ec=RED, ls="--", label="no receive took it"))
    ax.legend(
        handles=keys,
        loc="upper center",
        bbox_to_anchor=(0.5, 0.0),
        ncol=len(keys),
        frameon=False,
        handlelength=1.2,
        columnspacing=1.0,
    )
    ax.set_xticks(range(n), [f"rank {r}" for r in range(n)])
    ax.xaxis.tick_top()
    ax.tick_params(axis="x", length=0)
    ax.set_yticks([])
    ax.set_xlim(-0.55, n - 0.45)
    ax.set_ylim(-rows - 0.2 + 0.45, 0.5)
    for side in ax.spines.values():
        side.set_visible(False)
    return finish(fig, ax, title)
