"""Chapter 13's idea: the four moves by which a rank builds its part of the model,
in the trainer's (torchtitan's) order, drawn from the package's own definitions.

`four_moves` draws the model as its chain of layers (`parallel.hybrid.stages`:
the embeddings, the blocks, the head) and, panel by panel, what each move does to
it: the chain cut into pipeline stages where `stages.bounds` cuts it; each stage's
layers split over its tensor-parallel ranks, numbered as `hybrid.Layout.grid`
numbers them (TP innermost); the blocks, not the embeddings or the head, recomputed
in backward (`hybrid.build.checkpointed`); and last the data-parallel replicas,
whose same-place ranks average (DDP) or shard (ZeRO, FSDP) what they hold.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Rectangle

from distcourse.parallel.hybrid.layout import Layout
from distcourse.parallel.hybrid.stages import bounds
from distcourse.viz.common import SMALL, finish, styled

COLORS = plt.get_cmap("tab10").colors
ROW = 0.42  # a layer's height
WIDTH = 1.0  # a layer's width in the first three panels
GAP = 0.55  # between panels


def layer_names(n_layer: int) -> list[str]:
    """The chain's layers, top to bottom: 'embed', 'block 0', ..., 'head'."""
    return ["embed", *(f"block {i}" for i in range(n_layer)), "head"]


def stage_of(n_layer: int, pp: int) -> list[int]:
    """The pipeline stage of each layer of the chain (`stages.bounds`' cut)."""
    cuts = bounds(n_layer, pp)
    return [next(s for s in range(pp) if i < cuts[s + 1]) for i in range(n_layer + 2)]


def _slices(
    ax: plt.Axes,
    x: float,
    grid: list[list[int]],
    stages: list[int],
    hatch_blocks: bool,
) -> None:
    """One replica's layers, each cut into its stage's TP ranks (their numbers in
    their colours); the blocks hatched where they are recomputed."""
    tp = len(grid[0])
    for i, s in enumerate(stages):
        y = -i * ROW
        block = 0 < i < len(stages) - 1
        for t, rank in enumerate(grid[s]):
            left = x + t * WIDTH / tp
            ax.add_patch(
                Rectangle(
                    (left, y - ROW * 0.9),
                    WIDTH / tp,
                    ROW * 0.9,
                    fc=COLORS[rank % 10],
                    alpha=0.55,
                    ec="white",
                    hatch="///" if hatch_blocks and block else None,
                )
            )
            ax.text(
                left + WIDTH / tp / 2,
                y - ROW * 0.45,
                str(rank),
                ha="center",
                va="center",
                fontsize=SMALL + 0.5,
            )


@styled
def four_moves(
    dp: int = 2, pp: int = 2, tp: int = 2, n_layer: int = 4, title: str = ""
) -> Figure:
    """How a rank's part of a TinyGPT of `n_layer` blocks is built on dp x pp x tp
    ranks, in four panels read left to right: 1 the chain of layers cut into pp
    stages; 2 each stage's layers split over its tp ranks (the numbers are global
    ranks of replica 0); 3 the blocks recomputed in backward (hatched: their
    activations are not kept); 4 the dp replicas side by side, ranks at the same
    place in each averaging (DDP) or sharding (ZeRO, FSDP) what they hold."""
    if n_layer % pp:
        raise ValueError(f"n_layer={n_layer} blocks do not divide into pp={pp} stages")
    layout = Layout(dp=dp, pp=pp, tp=tp)
    grid, stages, names = layout.grid(), stage_of(n_layer, pp), layer_names(n_layer)
    rows = len(names)
    last = 3 * (WIDTH + GAP)  # the fourth panel's left edge
    span = dp * WIDTH + (dp - 1) * 0.35
    fig, ax = plt.subplots(figsize=(6.8, 0.45 * rows + 0.9))
    for i, name in enumerate(names):
        ax.text(-0.1, -i * ROW - ROW * 0.45, name, ha="right", va="center")
    for i, s in enumerate(stages):  # 1: the stages, shaded as the stage they join
        ax.add_patch(
            Rectangle(
                (0, -i * ROW - ROW * 0.9),
                WIDTH,
                ROW * 0.9,
                fc=str(0.9 - 0.18 * (s % 3)),
                ec="white",
            )
        )
    for s in range(pp):
        mid = [i for i, t in enumerate(stages) if t == s]
        y = -(mid[0] + mid[-1] + 1) / 2 * ROW + ROW * 0.05
        ax.text(WIDTH / 2, y, f"stage {s}", ha="center", va="center")
    _slices(ax, WIDTH + GAP, grid[0], stages, False)  # 2: TP
    _slices(ax, 2 * (WIDTH + GAP), grid[0], stages, True)  # 3: recomputed blocks
    for d in range(dp):  # 4: the replicas
        _slices(ax, last + d * (WIDTH + 0.35), grid[d], stages, False)
    if dp > 1:
        y = -rows * ROW - 0.12
        ax.add_patch(
            FancyArrowPatch(
                (last + WIDTH / 2, y),
                (last + (dp - 1) * (WIDTH + 0.35) + WIDTH / 2, y),
                arrowstyle="<|-|>",
                mutation_scale=10,
                color="0.3",
            )
        )
        ax.text(
            last + span / 2,
            y - 0.12,
            "same place: average or shard",
            ha="center",
            va="top",
            fontsize=SMALL,
        )
    heads = [
        (WIDTH / 2, f"1. stages\n--pp {pp}"),
        (WIDTH + GAP + WIDTH / 2, f"2. split matmuls\n--tp {tp}"),
        (2 * (WIDTH + GAP) + WIDTH / 2, "3. recompute\n--ckpt full"),
        (last + span / 2, f"4. replicas\n--dp {dp}, --zero, --fsdp"),
    ]
    for x, text in heads:
        ax.text(x, 0.12, text, ha="center", va="bottom")
    ax.set_xlim(-1.0, last + span + 0.05)
    ax.set_ylim(-rows * ROW - 0.45, 0.75)
    ax.axis("off")
    return finish(fig, ax, title)
