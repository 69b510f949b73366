"""What a run shows: a progress bar on rank 0 and a loss curve saved as a PNG.

The bar (tqdm) is drawn on rank 0 only, and only on a terminal (a log file or a
notebook cell gets no carriage returns); `quiet` turns it off. At each metrics
record it shows the loss, tokens per second (the whole batch's tokens over a
step's wall time), MFU where the device has a datasheet peak, and the fullest
rank's measured peak memory beside the planner's prediction (`metrics`).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import torch.distributed as dist
from tqdm import tqdm

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def mib(values: list | None) -> str:
    """The largest of `values` (bytes; None skipped) in MiB, or '-'."""
    known = [v for v in values or [] if v is not None]
    return f"{max(known) / 2**20:,.1f} MiB" if known else "-"


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
        self.row: dict = {}

    def update(self, row: dict, steps: int = 1) -> None:
        """`steps` more steps done; `row` the metrics record of the last."""
        self.row = row
        self.bar.set_postfix_str(self.line(with_step=False))
        self.bar.update(steps)
        self.done += steps

    def line(self, *, with_step: bool = True) -> str:
        """The last record as one line, for a log or a notebook (where no bar is
        drawn): 'step 24/24: loss 2.93, 3,154 tok/s, MFU 0.31, peak 612.0 MiB
        (plan 640.2 MiB)'. The loss to 2 decimals: a GPU's sums in another order
        move the 4th; MFU only where the device has a datasheet peak."""
        r = self.row
        head = f"step {self.done}/{self.total}: " if with_step else ""
        if not r:
            return head + "no step recorded"
        mfu = f", MFU {r['mfu']:.2f}" if r.get("mfu") is not None else ""
        return (
            f"{head}loss {r['loss']:.2f}, {r['tokens_per_s']:,.0f} tok/s{mfu}, peak "
            f"{mib(r.get('peak_bytes'))} (plan {mib(r.get('planned_bytes'))})"
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
