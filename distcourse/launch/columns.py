"""Per-rank output side by side: fold what every rank printed, lay out the rest.

A `%%ranks` cell (distcourse.launch.ranks) collects each rank's lines; this module
turns them into one output with two forms:

- text/plain, what nbval compares: stable and in rank order, one prefix per line,
      [all ranks] parameters identical: True
      [rank 0] loss 1.5651
      [rank 1] loss 1.1189
- text/html, what the book and JupyterLab show: a grid with one column per rank
  (rank numbers as headers); a line every rank printed identically is one row
  spanning the columns; long lines wrap inside their column, never widen the page.

Pure functions of strings, no ipyparallel: tested without engines. `show` lays out
per-rank results that did not come from a `%%ranks` cell (values returned by `spawn`,
a script's output sorted by `script.by_rank`) the same way.
"""

from __future__ import annotations

import difflib
import html
from collections.abc import Sequence
from dataclasses import dataclass

from IPython.display import display

# Inline styles: JupyterLab drops <style> elements of untrusted notebooks, not these.
# Colours are translucent greys so that light and dark themes both read them.
_TABLE = (
    "width:100%;table-layout:fixed;border-collapse:collapse;margin:0;font-size:0.85em"
)
_CELL = (
    "vertical-align:top;text-align:left;padding:0.25em 0.5em;"
    "border:1px solid rgba(127,127,127,0.3)"
)
_HEAD = _CELL + ";font-weight:bold;background:rgba(127,127,127,0.12)"
_SHARED = _CELL + ";background:rgba(127,127,127,0.06)"
_TEXT = (
    "margin:0;font-family:var(--pst-font-family-monospace,monospace);"
    "white-space:pre-wrap;overflow-wrap:anywhere;word-break:break-word"
)
_ERROR = ";color:#c62828"
_LABEL = "font-size:0.75em;opacity:0.65"


@dataclass(frozen=True)
class Shared:
    """Lines that every rank printed, identically and in this order."""

    lines: tuple[str, ...]


@dataclass(frozen=True)
class PerRank:
    """Lines that differ between ranks: `lines[r]` is rank r's (maybe none)."""

    lines: tuple[tuple[str, ...], ...]


Row = Shared | PerRank


def split_lines(text: str) -> list[str]:
    """Lines of a stream as a terminal shows them: a carriage return (a progress
    bar redrawn in place) keeps only what was written after it."""
    lines = [line.rsplit("\r", 1)[-1] for line in text.split("\n")]
    if lines and lines[-1] == "":
        lines.pop()  # the text ended with a newline
    return lines


def _common(outputs: list[list[str]]) -> list[str]:
    """A subsequence of lines common to every rank's output, in order."""
    common = outputs[0]
    for other in outputs[1:]:
        match = difflib.SequenceMatcher(None, common, other, autojunk=False)
        common = [
            line
            for block in match.get_matching_blocks()
            for line in common[block.a : block.a + block.size]
        ]
    return common


def fold(outputs: list[list[str]]) -> list[Row]:
    """Rows for the lines of each rank (outputs[r] = rank r's lines).

    Lines that every rank printed identically, in the same order, become Shared
    rows; everything between them is a PerRank row. One rank folds nothing.
    """
    if not outputs:
        return []
    if len(outputs) == 1:
        return [PerRank((tuple(outputs[0]),))] if outputs[0] else []
    rows: list[Row] = []
    starts = [0] * len(outputs)
    for anchor in _common(outputs):
        ends = [out.index(anchor, s) for out, s in zip(outputs, starts, strict=True)]
        before = tuple(
            tuple(o[s:e]) for o, s, e in zip(outputs, starts, ends, strict=True)
        )
        if any(before):
            rows.append(PerRank(before))
        if rows and isinstance(rows[-1], Shared):
            rows[-1] = Shared((*rows[-1].lines, anchor))
        else:
            rows.append(Shared((anchor,)))
        starts = [e + 1 for e in ends]
    rest = tuple(tuple(o[s:]) for o, s in zip(outputs, starts, strict=True))
    if any(rest):
        rows.append(PerRank(rest))
    return rows


def to_text(rows: list[Row], failed: dict[int, str] | None = None) -> str:
    """The text/plain form: every line prefixed by who printed it, in rank order."""
    out = []
    for row in rows:
        if isinstance(row, Shared):
            out += [f"[all ranks] {line}".rstrip() for line in row.lines]
        else:
            for rank, lines in enumerate(row.lines):
                out += [f"[rank {rank}] {line}".rstrip() for line in lines]
    for rank, error in sorted((failed or {}).items()):
        out.append(f"[rank {rank}] raised {error}")
    return "\n".join(out)


def _text(lines: tuple[str, ...] | list[str], style: str = "") -> str:
    body = html.escape("\n".join(lines))
    return f'<div class="dc-rank-text" style="{_TEXT}{style}">{body}</div>'


def _only_printer(rows: list[Row], failed: dict[int, str]) -> int | None:
    """The one rank that printed, when exactly one did (and none failed)."""
    printed = {
        r
        for row in rows
        if isinstance(row, PerRank)
        for r, ls in enumerate(row.lines)
        if ls
    }
    alone = len(printed) == 1 and not failed
    return (
        printed.pop() if alone and all(isinstance(r, PerRank) for r in rows) else None
    )


def to_html(
    rows: list[Row], world_size: int, failed: dict[int, str] | None = None
) -> str:
    """The text/html form: one column per rank, shared lines spanning them all.

    When one rank alone printed (`if rank == 0: print(...)`), only its column is
    drawn, headed with its number, instead of empty columns for the others.
    """
    failed = failed or {}
    only = _only_printer(rows, failed) if world_size > 1 else None
    shown = list(range(world_size)) if only is None else [only]
    label = "rank {} (the only rank that printed)" if only is not None else "rank {}"
    head = "".join(f'<th style="{_HEAD}">{label.format(r)}</th>' for r in shown)
    body = []
    for row in rows:
        if isinstance(row, Shared):
            body.append(
                f'<tr class="dc-all-ranks"><td colspan="{world_size}" '
                f'style="{_SHARED}" title="printed by every rank">'
                f'<div class="dc-all-label" style="{_LABEL}">all ranks</div>'
                f"{_text(row.lines)}</td></tr>"
            )
        else:
            cells = "".join(
                f'<td style="{_CELL}">{_text(row.lines[r])}</td>' for r in shown
            )
            body.append(f"<tr>{cells}</tr>")
    if failed:
        cells = "".join(
            f'<td style="{_CELL}">'
            + (_text([f"raised {failed[r]}"], _ERROR) if r in failed else "")
            + "</td>"
            for r in shown
        )
        body.append(f'<tr class="dc-rank-errors">{cells}</tr>')
    return (
        f'<div class="dc-ranks" style="max-width:100%">'
        f'<table class="dc-ranks-table" style="{_TABLE}">'
        f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div>"
    )


class RankOutput:
    """One cell's per-rank output; IPython displays it through _repr_mimebundle_."""

    def __init__(
        self, outputs: list[list[str]], failed: dict[int, str] | None = None
    ) -> None:
        self.world_size = len(outputs)
        self.rows = fold(outputs)
        self.failed = dict(failed or {})

    def __bool__(self) -> bool:
        return bool(self.rows or self.failed)

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, str]:  # noqa: ANN001
        return {
            "text/plain": to_text(self.rows, self.failed),
            "text/html": to_html(self.rows, self.world_size, self.failed),
        }

    def __repr__(self) -> str:
        return to_text(self.rows, self.failed)


def show(per_rank: Sequence[str | Sequence[str]]) -> None:
    """Display what each rank reported, side by side, as a `%%ranks` cell does.

    `per_rank[r]` is rank r's text (split at newlines; a progress bar keeps its last
    state) or its list of lines. Lines every rank reported identically fold into one
    "all ranks" row, so a line that may differ between runs (a timing) must name its
    rank, or it would fold in one run and not in another. Outside IPython the
    text/plain form is printed.
    """
    if isinstance(per_rank, str) or not per_rank:
        raise ValueError("show: give one text or list of lines per rank")
    outputs = [
        split_lines(out)
        if isinstance(out, str)
        else [part for line in out for part in str(line).split("\n")]
        for out in per_rank
    ]
    display(RankOutput(outputs))
