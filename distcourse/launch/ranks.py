"""`%%ranks`: run a cell on every rank like `%%px`, show the ranks' output side by side.

    ranks = cluster.start(4)        # registers %%ranks next to %%px
    %%ranks
    print(f"rank {rank}: loss {loss:.4f}")
    print("parameters identical on all ranks:", same)

The cell runs on every engine of the current ranks, in the same namespace `%%px`
uses, and blocks until all are done. Each rank's stdout, stderr and displayed text
become one output (distcourse.launch.columns): a column per rank in HTML, lines that
every rank printed identically once across the columns, and a text/plain form in
rank order for nbval. A figure a rank leaves open (or displays) is shown from rank 0;
`%%ranks --figures all` shows one per rank side by side, `--figures none` none.
A rank that raises makes the cell raise RankCellError, naming the rank and showing
its traceback, after the output of every rank is shown.

Outside `cluster.start`: `%load_ext distcourse.launch.cluster` registers it too.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ipyparallel as ipp
from IPython.core import magic_arguments
from IPython.core.magic import Magics, cell_magic, magics_class
from IPython.display import display

from distcourse import runtime
from distcourse.launch.columns import RankOutput, split_lines

OUTPUT_WAIT = 5.0  # seconds to wait for the engines' last output after the results


class RankCellError(runtime.RankError):
    """One or more ranks raised in a `%%ranks` cell: the lowest is `rank`,
    `failures` maps every failed rank to (exception name, message, traceback)."""

    def __init__(self, failures: dict[int, tuple[str, str, str]]) -> None:
        rank = min(failures)
        name, value, _ = failures[rank]
        super().__init__(rank, f"{name}: {value}")
        self.failures = failures

    def _render_traceback_(self) -> list[str]:
        """What IPython prints instead of this module's frames: each rank's own."""
        lines = []
        for rank, (name, value, tb) in sorted(self.failures.items()):
            lines.append(f"[rank {rank}] {name}: {value}")
            lines += (tb or "").splitlines()
        return lines


@dataclass
class CellResult:
    """What a `%%ranks` cell produced: the text output, figures, and any failure."""

    output: RankOutput
    figures: list[list[bytes]] = field(default_factory=list)  # PNGs, per rank
    error: RankCellError | None = None

    def show(self, figures: str = "0") -> None:
        """Display the output and the figures asked for; then raise a failure."""
        if self.output:
            display(self.output)
        for bundle in figure_bundles(self.figures, figures):
            display(bundle, raw=True)
        if self.error is not None:
            raise self.error


def _open_figures() -> list[bytes]:
    """Runs on a rank: every figure still open as PNG bytes, then closed.
    Self-contained (imports inside): ipyparallel ships it to the engine by value."""
    import io
    import sys

    if "matplotlib.pyplot" not in sys.modules:
        return []
    import matplotlib.pyplot as plt

    pngs = []
    for num in plt.get_fignums():
        buf = io.BytesIO()
        plt.figure(num).savefig(buf, format="png", bbox_inches="tight")
        pngs.append(buf.getvalue())
    plt.close("all")
    return pngs


def _rank_lines(ar: ipp.AsyncResult, i: int) -> tuple[list[str], list[bytes]]:
    """Rank i's lines (stdout, stderr, displayed text, result) and displayed PNGs."""
    lines = split_lines(ar.stdout[i]) + split_lines(ar.stderr[i])
    pngs = []
    for out in ar.outputs[i]:
        data = out.get("data", {})
        if "image/png" in data:
            pngs.append(base64.b64decode(data["image/png"]))
        elif "text/plain" in data:
            lines += split_lines(data["text/plain"])
    result = ar.execute_result[i]
    if result is not None and "text/plain" in result.get("data", {}):
        lines += split_lines(result["data"]["text/plain"])
    return lines, pngs


def execute(
    view: ipp.DirectView, cell: str, collect_figures: bool = True
) -> CellResult:
    """Run `cell` on every engine of `view` (engine r is rank r); collect the output."""
    ar = view.execute(cell, block=False, silent=False)
    failures: dict[int, tuple[str, str, str]] = {}
    try:
        ar.get()
    except ipp.error.CompositeError as err:
        for name, value, tb, info in err.elist:
            failures[info.get("engine_id", -1)] = (name, value, tb)
    ar.wait_for_output(OUTPUT_WAIT)
    order = sorted(range(len(ar.engine_id)), key=lambda i: ar.engine_id[i])
    collected = [_rank_lines(ar, i) for i in order]
    figures = [pngs for _, pngs in collected]
    if collect_figures:
        left_open = view.apply_sync(_open_figures)
        figures = [shown + more for shown, more in zip(figures, left_open, strict=True)]
    failed = {r: f"{n}: {v}" for r, (n, v, _) in failures.items()}
    output = RankOutput([lines for lines, _ in collected], failed)
    return CellResult(output, figures, RankCellError(failures) if failures else None)


def _png_bundle(png: bytes, text: str) -> dict[str, str]:
    return {"image/png": base64.b64encode(png).decode(), "text/plain": text}


def side_by_side(pngs: dict[int, bytes], per_row: int = 4) -> bytes:
    """One PNG of several ranks' figures in columns, each titled with its rank."""
    from matplotlib.figure import Figure
    from matplotlib.image import imread

    images = {r: imread(io.BytesIO(png), format="png") for r, png in pngs.items()}
    cols = min(per_row, len(images))
    rows = math.ceil(len(images) / cols)
    height = max(img.shape[0] for img in images.values()) / 100
    width = max(img.shape[1] for img in images.values()) / 100
    fig = Figure(figsize=(cols * width, rows * (height + 0.4)), dpi=100)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax in axes:
        ax.set_axis_off()
    for ax, (rank, img) in zip(axes, sorted(images.items()), strict=False):
        ax.imshow(img)
        ax.set_title(f"rank {rank}", fontsize=16)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def figure_bundles(figures: list[list[bytes]], which: str = "0") -> list[dict]:
    """Display bundles for `--figures which`: a rank's number, "all" or "none"."""
    if which == "none":
        return []
    if which == "all":
        most = max((len(f) for f in figures), default=0)
        return [
            _png_bundle(
                side_by_side({r: f[k] for r, f in enumerate(figures) if k < len(f)}),
                f"<figure {k + 1}: ranks side by side>",
            )
            for k in range(most)
        ]
    rank = int(which)
    if not 0 <= rank < len(figures):
        raise ValueError(f"--figures: no rank {rank} among 0..{len(figures) - 1}")
    return [
        _png_bundle(png, f"<figure {k + 1} of rank {rank}>")
        for k, png in enumerate(figures[rank])
    ]


def _figures_arg(value: str) -> str:
    if value in ("all", "none") or value.isdigit():
        return value
    raise ValueError(f"--figures takes a rank number, all or none, not {value!r}")


@magics_class
class RankMagics(Magics):
    """The `%%ranks` cell magic, bound to whatever view `current()` gives when a
    cell runs (cluster passes "the ranks `cluster.start` made last")."""

    def __init__(
        self, shell: Any, current: Callable[[], ipp.DirectView | None]
    ) -> None:
        super().__init__(shell)
        self.current = current

    @magic_arguments.magic_arguments()
    @magic_arguments.argument(
        "--figures",
        default="0",
        help="figures to show: a rank's number (default 0), all, or none",
    )
    @cell_magic
    def ranks(self, line: str, cell: str) -> None:
        """Run the cell on every rank; show each rank's output in its own column."""
        args = magic_arguments.parse_argstring(self.ranks, line)
        which = _figures_arg(args.figures)
        view = self.current()
        if view is None:
            raise RuntimeError("no ranks running: start them with cluster.start(n)")
        if which.isdigit() and int(which) >= len(view):  # before running anything
            raise ValueError(f"--figures {which}: there are {len(view)} ranks")
        result = execute(view, cell, collect_figures=which != "none")
        result.show(which)


def register(shell: Any, current: Callable[[], ipp.DirectView | None]) -> None:
    """Register `%%ranks` in `shell`, running cells on the view `current()` gives."""
    shell.register_magics(RankMagics(shell, current))
