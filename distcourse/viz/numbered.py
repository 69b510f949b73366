"""Every figure of the book goes through `figure`: numbered, captioned, described,
and readable at the size the book shows it.

`figure(fig, "12b.1", caption, alt)` returns a `Numbered` figure that a notebook
displays as its cell's value (or with IPython's `display`), in two forms:

- text/html, what the book and JupyterLab show: a <figure> holding the PNG (drawn
  at twice its size, for high-density screens), its alt text, and a caption that
  begins "Figure 12b.1."; `wide=True` lets it take the full page width (the
  right-hand contents fold away while it is in view, _static/dc-wide.js);
- text/plain, what nbval compares: "Figure 12b.1. <caption>", stable on any
  machine (book/nbval.cfg masks the PNG's bytes inside the HTML).

Readable means: the smallest text the figure draws, at the size the book shows it,
is at least `MIN_TEXT_PX`, the size of the book's smallest body text (per-rank
columns). A figure wider than the column is shrunk to fit it, and its text with it
(chapter 12b's ring figure, 1500 px wide in a 688-px column, showed 8-point labels
5 px high); `figure` refuses such a figure with the sizes to change, before it
reaches the book. tests/test_book_browser.py measures the column, the wide width
and the body's smallest text in a browser, so these numbers stay true.
"""

from __future__ import annotations

import base64
import html
import io
import re
from dataclasses import dataclass

import matplotlib.pyplot as plt
from matplotlib.backends.backend_agg import FigureCanvasAgg, RendererAgg
from matplotlib.figure import Figure

COLUMN_PX = 688  # the book's text column at a 1280 x 900 window
WIDE_PX = 936  # a wide figure's width there (136 % of the column)
MIN_TEXT_PX = 12.0  # the book's smallest body text: per-rank columns, 0.75rem
CSS_DPI = 100  # CSS pixels per inch of a figure (matplotlib's default dpi)
SHARP = 2  # the PNG holds SHARP x SHARP pixels per CSS pixel
_NUMBER = re.compile(r"^[0-9A-Za-z]+(\.[0-9]+)*$")


@dataclass(frozen=True)
class Text:
    """One piece of text a figure draws, and its size in points."""

    points: float
    text: str

    @property
    def px(self) -> float:
        """Its height in CSS pixels when the figure is shown at its natural size."""
        return self.points * CSS_DPI / 72


class _Recorder(RendererAgg):
    """An Agg renderer that notes every text it draws (tick labels, titles,
    legends, annotations): what the figure really shows, not what it holds."""

    def __init__(self, width: float, height: float, dpi: float) -> None:
        super().__init__(width, height, dpi)
        self.seen: list[Text] = []

    def draw_text(self, gc, x, y, s, prop, angle, ismath=False, mtext=None):  # noqa: ANN001, ANN201
        if str(s).strip():
            self.seen.append(Text(prop.get_size_in_points(), str(s)))
        return super().draw_text(gc, x, y, s, prop, angle, ismath, mtext)


def texts(fig: Figure) -> list[Text]:
    """Every text `fig` draws, in drawing order."""
    FigureCanvasAgg(fig)  # a canvas, so that layout engines can measure text
    width, height = fig.get_size_inches() * fig.dpi
    renderer = _Recorder(width, height, fig.dpi)
    fig.draw(renderer)
    return renderer.seen


def shown_scale(width_px: float, wide: bool = False) -> float:
    """How much the book shrinks a figure `width_px` CSS pixels wide (1: not at
    all): to the column's width, or to the wide width."""
    room = WIDE_PX if wide else COLUMN_PX
    return min(1.0, room / width_px)


def _caption_html(caption: str) -> str:
    """The caption with `code` spans and *emphasis*; everything else escaped."""
    out = html.escape(caption, quote=False)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    return re.sub(r"(?<![\w*])\*([^*\s][^*]*?)\*(?![\w*])", r"<em>\1</em>", out)


@dataclass(frozen=True)
class Numbered:
    """A figure ready for the book: its number, caption, alt text and PNG."""

    number: str
    caption: str
    alt: str
    png: bytes  # SHARP times the CSS size
    width: int  # CSS pixels at its natural size
    height: int
    smallest: Text
    wide: bool = False

    @property
    def anchor(self) -> str:
        """The figure's id in the page: 'figure-12b-1'."""
        return "figure-" + self.number.replace(".", "-")

    def __str__(self) -> str:
        return f"Figure {self.number}. {self.caption}"

    __repr__ = __str__

    def html(self) -> str:
        """The text/html form (see the module's docstring)."""
        data = base64.b64encode(self.png).decode("ascii")
        classes = "dc-figure dc-wide" if self.wide else "dc-figure"
        return (
            f'<figure class="{classes}" id="{self.anchor}" '
            f'data-min-text-px="{self.smallest.px:.2f}" style="margin:0.5em 0">'
            f'<img src="data:image/png;base64,{data}" '
            f'alt="{html.escape(self.alt)}" width="{self.width}" '
            f'height="{self.height}" style="max-width:100%;height:auto">'
            '<figcaption style="font-size:0.9em;margin-top:0.4em">'
            f'<span class="dc-figure-number" style="font-weight:bold">'
            f"Figure {html.escape(self.number)}.</span> "
            f"{_caption_html(self.caption)}</figcaption></figure>"
        )

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, str]:  # noqa: ANN001
        return {"text/plain": str(self), "text/html": self.html()}


def figure(
    fig: Figure, number: str, caption: str, alt: str, wide: bool = False
) -> Numbered:
    """`fig` numbered, captioned and described, for the book.

    number: "12b.1", the chapter and the figure's place in it (the browser test
    checks that a page's figures count 1, 2, ... under its chapter's number).
    caption: what the figure shows and how to read it (`code` and *emphasis*
    allowed). alt: the same for a reader who cannot see it, a sentence or two.
    wide: the figure may take the page's full width (WIDE_PX) instead of the
    column (COLUMN_PX).

    ValueError if the caption or alt text is empty, or if the figure's smallest
    text would show below MIN_TEXT_PX: a figure is drawn to be read.
    """
    if not _NUMBER.match(str(number)):
        raise ValueError(f"figure number {number!r}: write it as '12b.1'")
    for name, value in (("caption", caption), ("alt", alt)):
        if not str(value).strip():
            raise ValueError(f"Figure {number}: give it a {name}")
    drawn = texts(fig)
    buffer = io.BytesIO()
    fig.savefig(
        buffer,
        format="png",
        dpi=CSS_DPI * SHARP,
        bbox_inches="tight",
        pad_inches=0.05,
        metadata={"Software": None},
    )
    plt.close(fig)
    png = buffer.getvalue()
    width, height = (int.from_bytes(png[i : i + 4], "big") // SHARP for i in (16, 20))
    smallest = min(drawn, key=lambda t: t.points, default=Text(72.0, ""))
    shown = smallest.px * shown_scale(width, wide)
    if shown < MIN_TEXT_PX - 0.05:
        room = WIDE_PX if wide else COLUMN_PX
        need = MIN_TEXT_PX * 72 / CSS_DPI / shown_scale(width, wide)
        raise ValueError(
            f"Figure {number}: its smallest text, {smallest.text!r} at "
            f"{smallest.points:g} pt, would show {shown:.1f} px high: the figure is "
            f"{width} px wide and the book shows it at most {room} px wide. Make its "
            f"text at least {need:.1f} pt, or the figure narrower"
            + ("" if wide else ", or pass wide=True")
            + f" (the book's smallest text is {MIN_TEXT_PX:g} px)"
        )
    return Numbered(
        str(number), caption.strip(), alt.strip(), png, width, height, smallest, wide
    )
