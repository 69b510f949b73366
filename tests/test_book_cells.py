"""Chapters read well in JupyterLab as in the book: short cells, scripts shown as code.

- A code cell has at most MAX_CODE lines and a markdown cell at most MAX_MARKDOWN:
  a reader takes a cell in at once. A script shown in a fence (below) does not count
  toward its cell: it is the file, not prose.
- A script shown in a chapter is a fenced block right after a marker naming its file,

      <!-- file: book/scripts/ddp_train.py -->
      ```python
      ...the file's text...
      ```

  which JupyterLab and the book both render as code (a `{literalinclude}` directive
  is code in the book only: JupyterLab shows the directive). This test keeps the
  fence equal to the file. A part of a file is shown the same way after
  `<!-- from: path -->`: the fence must be consecutive lines of the file, with
  their common indentation removed (a loop shown without its method around it).
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "book").glob("*.ipynb"))
MAX_CODE, MAX_MARKDOWN = 20, 40
SHOWN = re.compile(
    r"<!-- (file|from): (\S+) -->\s*\n(`{3,})python\n(.*?)\n\3", re.DOTALL
)


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text())["cells"]


def _source(cell: dict) -> str:
    return "".join(cell["source"])


def _shown(path: Path, kind: str = "file") -> list[tuple[str, str]]:
    """(file, fenced text) of every script (kind "file") or part of one ("from")
    that a notebook shows."""
    return [
        (m[2], m[4])
        for cell in _cells(path)
        if cell["cell_type"] == "markdown"
        for m in SHOWN.finditer(_source(cell))
        if m[1] == kind
    ]


def test_the_marker_finds_a_fenced_script() -> None:
    text = "Run it:\n\n<!-- file: a.py -->\n```python\nprint(1)\n\nx = 2\n```\nAfter."
    assert [(m[2], m[4]) for m in SHOWN.finditer(text)] == [
        ("a.py", "print(1)\n\nx = 2")
    ]
    assert SHOWN.sub("", text) == "Run it:\n\n\nAfter."


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_scripts_shown_in_a_chapter_equal_their_files(path: Path) -> None:
    for name, fenced in _shown(path):
        file = ROOT / name
        assert file.is_file(), f"{path.name} shows {name}, which does not exist"
        assert fenced + "\n" == file.read_text(), (
            f"{path.name}: the fence under <!-- file: {name} --> differs from the "
            "file; paste the file's text into it again"
        )


def _is_part_of(fenced: str, text: str) -> bool:
    """Is `fenced` some consecutive lines of `text`, their common indent removed?"""
    want, lines = fenced.splitlines(), text.splitlines()
    return any(
        textwrap.dedent("\n".join(lines[i : i + len(want)])) == fenced
        for i in range(len(lines) - len(want) + 1)
    )


def test_a_part_is_consecutive_lines_of_its_file_dedented() -> None:
    text = "def f():\n    for i in x:\n        go(i)\n    done()\n"
    assert _is_part_of("for i in x:\n    go(i)", text)
    assert not _is_part_of("for i in x:\n    done()", text)  # not consecutive
    assert not _is_part_of("for i in y:\n    go(i)", text)  # not the file's


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_parts_of_files_shown_in_a_chapter_are_in_their_files(path: Path) -> None:
    for name, fenced in _shown(path, "from"):
        file = ROOT / name
        assert file.is_file(), f"{path.name} shows part of {name}: no such file"
        assert _is_part_of(fenced, file.read_text()), (
            f"{path.name}: the fence under <!-- from: {name} --> is not consecutive "
            "lines of the file; paste them again"
        )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_scripts_are_shown_as_fences_not_literalinclude(path: Path) -> None:
    used = [i for i, c in enumerate(_cells(path)) if "{literalinclude}" in _source(c)]
    assert not used, f"{path.name}: cells {used} use {{literalinclude}}"


def _too_long(path: Path) -> list[str]:
    found = []
    for i, cell in enumerate(_cells(path)):
        kind = cell["cell_type"]
        limit = MAX_CODE if kind == "code" else MAX_MARKDOWN
        lines = len(SHOWN.sub("", _source(cell)).strip().splitlines())
        if kind in ("code", "markdown") and lines > limit:
            found.append(f"cell {i} ({kind}, id {cell.get('id')}): {lines} > {limit}")
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_cell_is_longer_than_a_reader_takes_in_at_once(path: Path) -> None:
    long = _too_long(path)
    assert not long, f"{path.name} has long cells:\n" + "\n".join(long)


WIDTH = 88  # README: code lines fit a book page, as ruff's line length in pyproject


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_code_lines_fit_the_page(path: Path) -> None:
    wide = [
        f"cell {i}: {len(line)} characters: {line.strip()[:60]}"
        for i, cell in enumerate(_cells(path))
        if cell["cell_type"] == "code"
        for line in _source(cell).splitlines()
        if len(line) > WIDTH
    ]
    assert not wide, f"{path.name} has code lines over {WIDTH}:\n" + "\n".join(wide)
