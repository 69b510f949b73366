"""What every figure shares: value labels and the finishing touches.

Every figure function returns a matplotlib Figure and never calls plt.show(): a
notebook displays the returned figure, a test inspects it, and the Agg backend is
enough.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure


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
