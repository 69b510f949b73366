"""distcourse.viz.numbered: every figure numbered, captioned, described and readable
at the size the book shows it; and every figure function of viz passes."""

from __future__ import annotations

import base64
import re

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from viz_samples import SAMPLES, WIDE  # noqa: E402

from distcourse import viz  # noqa: E402
from distcourse.viz import numbered as vf  # noqa: E402


def small_figure(width: float = 5.0, points: float = 10.0) -> plt.Figure:
    fig, ax = plt.subplots(figsize=(width, 2.5))
    ax.plot([0, 1], [0, 1])
    ax.set_title("a title", fontsize=points)
    ax.tick_params(labelsize=points)
    ax.set_xlabel("x", fontsize=points)
    ax.set_ylabel("y", fontsize=points)
    return fig


def test_a_figure_is_numbered_captioned_described_in_both_forms() -> None:
    shown = viz.figure(small_figure(), "12b.1", "The ring, `cp` ranks.", "A ring.")
    bundle = shown._repr_mimebundle_()
    assert bundle["text/plain"] == "Figure 12b.1. The ring, `cp` ranks."
    html = bundle["text/html"]
    assert html.startswith('<figure class="dc-figure" id="figure-12b-1" ')
    assert 'alt="A ring."' in html
    number = '<span class="dc-figure-number" style="font-weight:bold">Figure 12b.1.'
    assert number in html
    assert "The ring, <code>cp</code> ranks.</figcaption>" in html
    # the PNG is drawn at twice the size the page gives the <img>
    data = re.search(r'src="data:image/png;base64,([^"]+)"', html)[1]
    png = base64.b64decode(data)
    assert int.from_bytes(png[16:20], "big") == vf.SHARP * shown.width
    assert f'width="{shown.width}" height="{shown.height}"' in html
    assert f'data-min-text-px="{10 * vf.CSS_DPI / 72:.2f}"' in html


def test_the_smallest_text_is_what_the_figure_draws() -> None:
    fig = small_figure(points=11)
    fig.axes[0].text(0.5, 0.5, "tiny", fontsize=6)
    fig.axes[0].text(0.5, 0.5, "hidden", fontsize=3, visible=False)
    assert min(vf.texts(fig), key=lambda t: t.points) == vf.Text(6.0, "tiny")
    off = small_figure(points=11)
    off.axes[0].axis("off")  # its tick labels are not drawn: they do not count
    assert min(t.points for t in vf.texts(off)) == 11


def test_a_figure_the_book_would_shrink_below_readable_is_refused() -> None:
    # 8-point labels on a 15-inch figure: chapter 12b's ring, 5 px high in the book
    with pytest.raises(
        ValueError, match=r"Figure 3\.1: its smallest text, '.*' at 8 pt"
    ):
        viz.figure(small_figure(15, 8), "3.1", "caption", "alt")
    # the same text on a figure that fits the column is fine, and a wide one too
    viz.figure(small_figure(6, 9), "3.1", "caption", "alt")
    viz.figure(small_figure(9, 9), "3.2", "caption", "alt", wide=True)
    with pytest.raises(ValueError, match="or pass wide=True"):
        viz.figure(small_figure(9, 9), "3.2", "caption", "alt")


def test_a_figure_needs_a_number_a_caption_and_alt_text() -> None:
    with pytest.raises(ValueError, match="give it a caption"):
        viz.figure(small_figure(), "1.1", " ", "alt")
    with pytest.raises(ValueError, match="give it a alt"):
        viz.figure(small_figure(), "1.1", "caption", "")
    with pytest.raises(ValueError, match="write it as '12b.1'"):
        viz.figure(small_figure(), "Figure 1", "caption", "alt")


def test_a_wide_figure_says_so_for_the_page() -> None:
    shown = viz.figure(small_figure(9), "8.1", "caption", "alt", wide=True)
    assert shown.html().startswith('<figure class="dc-figure dc-wide"')
    assert vf.shown_scale(shown.width, wide=True) == 1.0


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_every_figure_of_the_package_reads_at_the_size_the_book_shows_it(
    name: str,
) -> None:
    shown = viz.figure(SAMPLES[name](), "1.1", "caption", "alt", wide=name in WIDE)
    scale = vf.shown_scale(shown.width, name in WIDE)
    assert shown.smallest.px * scale >= vf.MIN_TEXT_PX - 0.05
    if name not in WIDE:  # a figure that needs no more room than the column
        assert shown.width <= vf.COLUMN_PX


def test_every_figure_function_of_viz_has_a_sample() -> None:
    drawn = {
        n
        for n in viz.__all__
        if n not in {"figure", "Numbered"} and callable(getattr(viz, n))
    }
    assert drawn <= set(SAMPLES), (
        f"no sample in tests/viz_samples.py: {drawn - set(SAMPLES)}"
    )
