"""What every figure shares: the house style, value labels and the finishing touches.

Every figure function returns a matplotlib Figure and never calls plt.show(): a
notebook displays the returned figure (through `viz.figure`, which numbers and
captions it), a test inspects it, and the Agg backend is enough.

The house style (`STYLE`, applied by `@styled`) keeps every text at `SMALL` points or
more: 12.5 CSS pixels at a figure's natural size, above the book's smallest body
text (`viz.numbered.MIN_TEXT_PX`), so a figure no wider than the column it is shown
in reads as well as the text around it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

SMALL = 9.0  # points: the smallest text a figure draws (labels in cells, legends)
STYLE = {
    "font.size": 10.0,
    "axes.titlesize": 10.5,
    "axes.labelsize": 10.0,
    "xtick.labelsize": SMALL + 0.5,
    "ytick.labelsize": SMALL + 0.5,
    "legend.fontsize": SMALL + 0.5,
    "legend.title_fontsize": SMALL + 0.5,
    "figure.titlesize": 11.0,
}
P = ParamSpec("P")


def styled(draw: Callable[P, Figure]) -> Callable[P, Figure]:
    """Draw the figure under the house style (text sizes are fixed when a text is
    made, so the style must be in force while the function draws)."""

    @functools.wraps(draw)
    def inner(*args: P.args, **kwargs: P.kwargs) -> Figure:
        with plt.rc_context(STYLE):
            return draw(*args, **kwargs)

    return inner


def label(value: float) -> str:
    """A cell's value as a short label: 3 for 3.0, 0.333 for 1/3."""
    return f"{value:g}" if float(value).is_integer() else f"{value:.3g}"


def finish(fig: Figure, ax: plt.Axes, title: str) -> Figure:
    """Title, tight layout, and close: the caller displays the returned figure."""
    if title:
        ax.set_title(title)
    fig.tight_layout()
    plt.close(fig)  # pyplot must not show it a second time
    return fig
