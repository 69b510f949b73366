"""What a run shows: a progress bar on rank 0 and a loss curve saved as a PNG.

The bar (tqdm) is drawn on rank 0 only, and only on a terminal (a log file or a
notebook cell gets no carriage returns); `quiet` turns it off. It shows the loss,
tokens per second (the whole batch's tokens over the step's wall time) and the
bytes each rank holds (parameters, gradients, optimizer state, activations at
the step's peak: `HybridGPT.held`), as the smallest and largest over the ranks.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from tqdm import tqdm

from distcourse import runtime

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def held_per_rank(held: int) -> list[int]:
    """Every rank's `held` bytes (a collective over the world)."""
    mine = torch.tensor([held], dtype=torch.int64, device=runtime.device())
    every = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return [int(t.item()) for t in every]


class Progress:
    """A tqdm bar over steps [start, total) on rank 0 of a terminal, else none."""

    def __init__(self, start: int, total: int, *, quiet: bool = False) -> None:
        shown = dist.get_rank() == 0 and not quiet and sys.stderr.isatty()
        # torchrun's workers see a terminal 0 rows high and tqdm hides a bar below
        # the last row: shutil's size falls back to 24 rows where the height is 0
        rows = shutil.get_terminal_size().lines
        self.bar = tqdm(
            total=total, initial=start, disable=not shown, unit="step", nrows=rows
        )
        self.done, self.total = start, total
        self.last = (float("nan"), 0.0, 0.0, 0.0)  # loss, tok/s, MiB least, most

    def update(self, loss: float, tokens_per_s: float, held: list[int]) -> None:
        """One step done: its loss, speed and the bytes each rank holds."""
        mib = [h / 2**20 for h in held]
        self.last = (loss, tokens_per_s, min(mib), max(mib))
        self.bar.set_postfix_str(
            f"loss {loss:.4f}, {tokens_per_s:,.0f} tok/s, "
            f"mem/rank {min(mib):.2f}-{max(mib):.2f} MiB"
        )
        self.bar.update(1)
        self.done += 1

    def line(self) -> str:
        """The bar's last state as one line, for a log or a notebook (where no
        bar is drawn): 'step 24/24: loss 2.93, 3,154 tok/s, mem/rank 0.60-0.91
        MiB'. The loss to 2 decimals: a GPU's sums in another order move the 4th."""
        loss, speed, low, high = self.last
        return (
            f"step {self.done}/{self.total}: loss {loss:.2f}, {speed:,.0f} tok/s, "
            f"mem/rank {low:.2f}-{high:.2f} MiB"
        )

    def close(self) -> None:
        """Close the bar."""
        self.bar.close()


def curves(runs: dict[str, list[float]], title: str) -> Figure:
    """A figure of each run's loss per step (steps counted from 1), labelled
    by its key; a run whose losses are None at the start (a run resumed at step
    s) is drawn from its first loss on."""
    import matplotlib.pyplot as plt  # a notebook's inline backend shows it

    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    styles = ["-", "--", ":", "-."]
    for i, (label, losses) in enumerate(runs.items()):
        steps = [s + 1 for s, v in enumerate(losses) if v is not None]
        shown = [v for v in losses if v is not None]
        ax.plot(steps, shown, styles[i % len(styles)], label=label, linewidth=1.6)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (cross-entropy, nats)")
    ax.set_title(title)
    if len(runs) > 1:
        ax.legend()
    fig.tight_layout()
    plt.close(fig)  # the caller shows or saves it; pyplot must not show it again
    return fig


def save_curve(losses: list[float], path: str | Path, title: str) -> Path:
    """The loss of each step as a PNG at `path` (matplotlib, no display needed)."""
    path = Path(path)
    curves({"loss": losses}, title).savefig(path, dpi=100)
    return path
