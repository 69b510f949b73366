"""One text-table formatter for every report the package prints.

The benchmarks, the communication ledger, the backend table, the book run and the
environment check all print rows of cells in fixed columns. `aligned` lays them out
once, so the rules are the same everywhere: each column has a width and an alignment
("<", ">" or "^"), a gap of spaces before it, and a cell wider than its column pushes
the rest of its line along (as an f-string's `{cell:>9}` does) rather than cutting.
A line's last cell gets no padding on its right, so no line ends in spaces added here.
Cells are formatted by the caller (`f"{ms:.2f}"`): the table only places text.
"""

from collections.abc import Iterable, Sequence

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
