"""Figures of a device mesh: where each rank sits, who talks to whom along each axis,
and how many bytes each axis carries per step.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import torch
from matplotlib.figure import Figure

from distcourse.viz.common import SMALL, finish, styled

_AXIS_COLORS = {"dp": "C0", "pp": "C2", "tp": "C1"}


def _position(coord: Sequence[int], shape: Sequence[int]) -> tuple[float, float]:
    """Where a rank of a 3-axis mesh is drawn: the last axis across, the middle one
    down, the first as side-by-side blocks with a gap between them."""
    block, row, col = coord
    return 1.4 * (block * (shape[2] + 0.6) + col), -row


def _route(points: list[tuple[float, float]], lift: float) -> list[tuple[float, float]]:
    """A group's line: straight down a column (the rows are far apart); along a
    row, over the boxes (raised by `lift`): a straight line there would hide behind
    the boxes it joins, whose sides almost touch, and behind any between them."""
    xs, ys = zip(*points, strict=True)
    if len(set(ys)) > 1:
        return points
    top = ys[0] + lift
    return [(xs[0], ys[0]), (xs[0], top), (xs[-1], top), (xs[-1], ys[-1])]


@styled
def groups_of(shape: Sequence[int], axis: int) -> list[list[int]]:
    """The ranks of each group along `axis` of a mesh `arange(world).view(shape)`."""
    grid = torch.arange(int(torch.tensor(shape).prod())).view(*shape)
    moved = grid.movedim(axis, -1).reshape(-1, shape[axis])
    return moved.tolist()


@styled
def mesh_groups(
    shape: Sequence[int],
    names: Sequence[str],
    groups: dict[str, Sequence[Sequence[int]]] | None = None,
    title: str = "",
) -> Figure:
    """One panel per axis: every rank as a box labelled with its rank and its
    coordinates, and that axis's groups as coloured lines joining their ranks.

    `groups` (axis name -> list of groups, each a list of ranks) is what the ranks
    themselves report (mesh.ranks(axis) on each); without it the groups are those
    of `arange(world).view(shape)`, TP innermost.
    """
    shape, names = tuple(shape), tuple(names)
    if len(shape) != len(names) or not 1 <= len(shape) <= 3:
        raise ValueError(f"1 to 3 axes, one name each: got {shape} and {names}")
    world = int(torch.tensor(shape).prod())
    coords = [torch.unravel_index(torch.tensor(r), shape) for r in range(world)]
    coords = [tuple(int(c) for c in cs) for cs in coords]
    pad = (1,) * (3 - len(shape)) + shape
    where = {r: _position((0,) * (3 - len(c)) + c, pad) for r, c in enumerate(coords)}
    fig, axes = plt.subplots(1, len(names), figsize=(3.0 * len(names), 2.8))
    axes = [axes] if len(names) == 1 else list(axes)
    for k, (ax, name) in enumerate(zip(axes, names, strict=True)):
        color = _AXIS_COLORS.get(name, f"C{k + 3}")
        found = (groups or {}).get(name) or groups_of(shape, k)
        for i, group in enumerate(found):
            path = _route([where[r] for r in group], 0.35 + 0.1 * (i % 2))
            xs, ys = zip(*path, strict=True)
            ax.plot(xs, ys, "-", color=color, lw=6, alpha=0.35, zorder=1)
        for r, (x, y) in where.items():
            ax.text(
                x,
                y,
                f"{r}\n{coords[r]}",
                ha="center",
                va="center",
                zorder=2,
                fontsize=SMALL,
                bbox=dict(boxstyle="round", fc="white", ec="0.4"),
            )
        many = "s" if len(found) > 1 else ""
        ax.set_title(
            f"{name}: {len(found)} group{many} of {len(found[0])}", fontsize=10
        )
        xs, ys = zip(*where.values(), strict=True)
        ax.set_xlim(min(xs) - 0.7, max(xs) + 0.7)
        ax.set_ylim(min(ys) - 0.5, max(ys) + 0.7)
        ax.axis("off")
    if title:
        fig.suptitle(title, fontsize=10)
    return finish(fig, axes[-1], "")


@styled
def axis_bytes(
    measured: dict[str, dict[str, int]],
    formula: dict[str, dict[str, int]],
    title: str = "",
) -> Figure:
    """Stacked bars of bytes sent per step, one bar per label (a layout, a rank),
    one segment per axis; the formula's totals as black ticks over each segment.
    """
    labels = list(measured)
    axes_seen = list(dict.fromkeys(a for m in measured.values() for a in m))
    fig, ax = plt.subplots(figsize=(1.2 * len(labels) + 2.5, 3.4))
    bottom = [0.0] * len(labels)
    for axis in axes_seen:
        heights = [measured[lab].get(axis, 0) / 1024 for lab in labels]
        color = _AXIS_COLORS.get(axis)
        ax.bar(labels, heights, bottom=bottom, color=color, label=axis, width=0.6)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    tops = [0.0] * len(labels)
    for axis in axes_seen:
        tops = [
            t + formula[lab].get(axis, 0) / 1024
            for t, lab in zip(tops, labels, strict=True)
        ]
        ax.scatter(labels, tops, marker="_", s=900, color="black", zorder=3)
    ax.scatter([], [], marker="_", s=200, color="black", label="formula")
    ax.set_ylabel("KiB sent per step by a rank")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(True, axis="y", alpha=0.3)
    return finish(fig, ax, title)


@styled
def layout_costs(rows: Sequence[dict], title: str = "") -> Figure:
    """Every layout of one world side by side: step time (left) and the memory of
    its fullest rank, model state and activations stacked (right). `rows` as
    `bench.hybrid.measure` gives them; the fastest layout's bar is outlined."""
    names = [r["layout"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.0, 3.4))
    fastest = min(range(len(rows)), key=lambda i: rows[i]["step_ms"])
    bars = left.bar(names, [r["step_ms"] for r in rows], color="0.6")
    bars[fastest].set(color="C2", edgecolor="black")
    left.set(ylabel="step time (ms)", xlabel="dp x pp x tp")
    state = [r["memory_kib"] - r["activations_kib"] for r in rows]
    right.bar(names, state, color="C0", label="parameters, gradients, AdamW")
    right.bar(
        names,
        [r["activations_kib"] for r in rows],
        bottom=state,
        color="C1",
        label="activations (peak)",
    )
    right.set(ylabel="KiB on the fullest rank", xlabel="dp x pp x tp")
    right.legend()
    for ax in (left, right):
        ax.tick_params(axis="x", labelrotation=45)
        ax.grid(True, axis="y", alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=10)
    return finish(fig, right, "")
