"""Figures of the book's Markdown pages, which run no code: drawn by the package,
stored as HTML beside the page (book/figures/), and included with MyST's raw
directive, so that they are numbered, captioned and checked as the notebooks'
figures are (`viz.figure`).

    python -m distcourse.viz.pages      # writes book/figures/*.html

tests/test_viz_pages.py fails when a stored figure differs from what this module
draws (its PNG masked, as nbval masks the notebooks' figures).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import matplotlib

from distcourse.viz.numbered import Numbered, figure
from distcourse.viz.schematics import strategies


def strategy_map() -> Numbered:
    """The introduction's map: what each strategy splits across its ranks."""
    return figure(
        strategies(4),
        "1",
        "What each strategy splits across four ranks. A row per strategy, with "
        "the chapter that builds it; a column per thing a training step holds or "
        "processes. Four colours: each rank holds (or processes) its own quarter. "
        "Grey: every rank holds all of it. *Model state* is the gradients and the "
        "optimizer's state, and the weights where they are split. Chapters 8 and "
        "13 combine the rows: a layout is one degree per row.",
        "A grid of seven strategies against six things a training step holds: "
        "batch, sequence, layers, weight matrices, model state and experts. Data "
        "parallelism splits only the batch; ZeRO-1 and ZeRO-2 also split the model "
        "state; FSDP splits the batch, the weight matrices and the model state; "
        "tensor parallelism splits the weight matrices and model state; pipeline "
        "parallelism splits the layers and model state; context parallelism "
        "splits the sequence; expert parallelism splits the batch and the experts.",
    )


PAGES: dict[str, Callable[[], Numbered]] = {"strategies.html": strategy_map}
FOLDER = Path(__file__).resolve().parents[2] / "book" / "figures"


def write(folder: Path = FOLDER) -> list[Path]:
    """Draw every page figure into `folder`; the paths written."""
    matplotlib.use("Agg")
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, draw in PAGES.items():
        path = folder / name
        path.write_text(draw().html() + "\n")
        written.append(path)
    return written


if __name__ == "__main__":
    for path in write(Path(sys.argv[1]) if len(sys.argv) > 1 else FOLDER):
        print(f"wrote {path}")
