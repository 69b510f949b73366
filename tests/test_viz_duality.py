"""distcourse.viz.duality: forward and backward bytes per conversion, headless."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

from matplotlib.figure import Figure  # noqa: E402

from distcourse import viz  # noqa: E402
from distcourse.global_tensor.duality import Cost  # noqa: E402


def test_conversion_bytes_draws_a_pair_of_bars_per_conversion() -> None:
    costs = [
        Cost("S(0)", "B", "P", "S(0)", "all_gather", "reduce_scatter", 168, 144, True),
        Cost("P", "B", "B", "B", "all_reduce", "nothing", 288, 0, True),
    ]
    fig = viz.conversion_bytes(costs, "two conversions")
    ax = fig.axes[0]
    assert isinstance(fig, Figure)
    widths = sorted(round(p.get_width()) for p in ax.patches)
    assert widths == [0, 144, 168, 288]
    texts = [t.get_text() for t in ax.texts]
    assert "dy P -> S(0): reduce_scatter (n-1)T/n" in texts
    assert "all_reduce 2(n-1)T/n" in texts and "dy B -> B: nothing" in texts
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == ["P -> B", "S(0) -> B"]  # the first conversion on top
