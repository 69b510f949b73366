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

import torch
import torch.distributed as dist
from tqdm import tqdm

from distcourse import runtime


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

    def update(self, loss: float, tokens_per_s: float, held: list[int]) -> None:
        """One step done: its loss, speed and the bytes each rank holds."""
        mib = [h / 2**20 for h in held]
        self.bar.set_postfix_str(
            f"loss {loss:.4f}, {tokens_per_s:,.0f} tok/s, "
            f"mem/rank {min(mib):.2f}-{max(mib):.2f} MiB"
        )
        self.bar.update(1)

    def close(self) -> None:
        """Close the bar."""
        self.bar.close()


def save_curve(losses: list[float], path: str | Path, title: str) -> Path:
    """The loss of each step as a PNG at `path` (matplotlib, no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(range(1, len(losses) + 1), losses)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (cross-entropy, nats)")
    ax.set_title(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
