"""One text-table formatter for every report the package prints.

The benchmarks, the communication ledger, the backend table, the book run and the
environment check all print rows of cells in fixed columns. `aligned` lays them out
once, so the rules are the same everywhere: each column has a width and an alignment
("<", ">" or "^"), a gap of spaces before it, and a cell wider than its column pushes
the rest of its line along (as an f-string's `{cell:>9}` does) rather than cutting.
A line's last cell gets no padding on its right, so no line ends in spaces added here.
Cells are formatted by the caller (`f"{ms:.2f}"`): the table only places text.

`Table` holds the same rows for a notebook: it prints as that text and displays as
an HTML table (the book shows tables as tables; nbval compares the text).
"""

from collections.abc import Iterable, Sequence
from html import escape

ALIGNS = "<>^"


def aligned(
    rows: Iterable[Sequence[object]],
    widths: Sequence[int] | None = None,
    align: str = "",
    gaps: int | Sequence[int] = 1,
) -> str:
    """The rows as lines of aligned columns (the header, if any, is just a row).

    widths: the least width of each column; None makes each column as wide as its
    widest cell. align: one of "<>^" per column, "<" where it is shorter. gaps: the
    spaces before every column but the first, one number for all or one per column
    boundary. A row may have fewer cells than there are columns (a header that ends
    early, a total that spans columns by passing "" cells).
    """
    rows = [[str(cell) for cell in row] for row in rows]
    columns = max((len(row) for row in rows), default=0)
    if widths is None:
        widths = [max(len(r[k]) for r in rows if k < len(r)) for k in range(columns)]
    if len(widths) < columns:
        raise ValueError(f"{len(widths)} widths for rows of up to {columns} cells")
    bad = set(align) - set(ALIGNS)
    if bad:
        raise ValueError(f"align takes only {ALIGNS!r}, not {''.join(sorted(bad))!r}")
    align = align.ljust(columns, "<")
    gaps = [gaps] * max(columns - 1, 0) if isinstance(gaps, int) else list(gaps)
    if len(gaps) < columns - 1:
        raise ValueError(f"{len(gaps)} gaps for rows of up to {columns} cells")
    before = [0, *gaps]  # the spaces before each column
    lines = []
    for row in rows:
        last = len(row) - 1
        placed = (
            " " * before[k] + _place(cell, align[k], widths[k], k == last)
            for k, cell in enumerate(row)
        )
        lines.append("".join(placed))
    return "\n".join(lines)


def _place(cell: str, how: str, width: int, last: bool) -> str:
    """`cell` padded to `width` as `how` says; a line's last cell not on its right."""
    if not last or how == ">":
        return f"{cell:{how}{width}}"
    left = max(width - len(cell), 0) // 2 if how == "^" else 0  # as format's "^"
    return " " * left + cell


# ------------------------------------------------------------- tables as tables ----
# The same rows, shown as an HTML table where a notebook or the book displays them,
# and printed as the aligned text above everywhere else. Inline styles: JupyterLab
# drops <style> elements of untrusted notebooks, not these; the book's CSS
# (_static/custom.css, "dc-table") adds the rest.
_TABLE_STYLE = (
    "border-collapse:collapse;margin:0.25em 0;font-size:0.85em;"
    "font-variant-numeric:tabular-nums"
)
_ROW_STYLE = "border-bottom:1px solid rgba(127,127,127,0.25)"
_HEAD_ROW_STYLE = "border-bottom:2px solid rgba(127,127,127,0.45)"
_CELL_STYLE = "padding:0.2em 0.7em;white-space:pre"
_SIDE = {"<": "left", ">": "right", "^": "center"}


def _cell(tag: str, text: str, how: str, extra: str = "") -> str:
    """One <th> or <td>: never wrapped, aligned as its column (left unsaid)."""
    side = "" if how == "<" else f";text-align:{_SIDE[how]}"
    return f'<{tag}{extra} style="{_CELL_STYLE}{side}">{escape(text)}</{tag}>'


class Table:
    """Rows of cells with a header: printed as `aligned` text, displayed as HTML.

    In a notebook a Table shown as a cell's value (or with IPython's `display`) has
    two forms: text/plain, the aligned text (what nbval compares, and what a
    terminal shows), and text/html, a table whose cells never wrap. `print(table)`
    and `str(table)` give the text alone, so a function that returned a text
    table can return a Table and its callers keep working.

    header: the column names. rows: the body; cells are formatted by the caller,
    as for `aligned`. align: one of "<>^" per column ("<" where shorter), for both
    forms. caption: a sentence above the table (text: its first line).
    widths, gaps: the text form's layout, as `aligned` takes them.
    """

    def __init__(
        self,
        header: Sequence[object],
        rows: Iterable[Sequence[object]],
        align: str = "",
        caption: str = "",
        widths: Sequence[int] | None = None,
        gaps: int | Sequence[int] = 2,
    ) -> None:
        self.header = tuple(str(cell) for cell in header)
        self.rows = tuple(tuple(str(cell) for cell in row) for row in rows)
        self.columns = max([len(self.header), *(len(r) for r in self.rows)])
        self.align = align.ljust(self.columns, "<")
        self.caption = caption
        self.text = aligned([self.header, *self.rows], widths, self.align, gaps)

    def __str__(self) -> str:
        return f"{self.caption}\n{self.text}" if self.caption else self.text

    __repr__ = __str__

    def html(self) -> str:
        """The text/html form: a <table class="dc-table"> with one <th> per column
        and a data-label per cell (the column's name, for the phone layout)."""
        head = "".join(
            _cell("th", h, a) for h, a in zip(self.header, self.align, strict=False)
        )
        body = []
        for row in self.rows:
            cells = []
            for k, cell in enumerate(row):
                # a short row (a total) lets its last cell span the columns left
                span = self.columns - k if k == len(row) - 1 else 1
                more = f' colspan="{span}"' if span > 1 else ""
                label = self.header[k] if k < len(self.header) else ""
                extra = f'{more} data-label="{escape(label)}"'
                cells.append(_cell("td", cell, self.align[k], extra))
            body.append(f'<tr style="{_ROW_STYLE}">{"".join(cells)}</tr>')
        caption = (
            f'<caption style="caption-side:top;text-align:left">'
            f"{escape(self.caption)}</caption>"
            if self.caption
            else ""
        )
        return (
            f'<div class="dc-table"><table style="{_TABLE_STYLE}">{caption}'
            f'<thead><tr style="{_HEAD_ROW_STYLE}">{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody>"
            "</table></div>"
        )

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, str]:  # noqa: ANN001
        return {"text/plain": str(self), "text/html": self.html()}
