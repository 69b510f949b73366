"""What README.md and ARCHITECTURE.md say of the code, where a test can read it.

The chapters table's rank counts are the most ranks each notebook starts at once
(its `cluster.start(N)`, `spawn(fn, N)` and `--nproc-per-node N`), or the counts a
chapter without a cluster spawns (its own or its labs'); the lists of exercise
modules are the modules in distcourse/exercises/.
(Code lines of the notebooks fit a book page: tests/test_book_cells.py.)
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat

from distcourse import labs
from distcourse.launch import bookrun

ROOT = Path(__file__).resolve().parents[1]
ROW = re.compile(r"^\| (\d+)([a-z]?) \| .* \| ([^|]+) \|$", re.MULTILINE)
UP_TO = re.compile(r"cluster\.start\(min\((\d+)")  # one rank per GPU, at most N
EXERCISE = re.compile(r"ch(\d+)(?:_(\w+))?")


def _chapter_file(number: str, letter: str) -> Path:
    (found,) = ROOT.glob(f"book/{int(number):02d}{letter}_*")
    return found


def _counts(nb: nbformat.NotebookNode) -> tuple[set[int], set[int], bool]:
    """(counts written, counts 'up to' the GPUs, whether a cell starts a cluster)."""
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    written = {
        int(next(n for n in m.groups() if n))
        for source in code
        for m in bookrun.RANK_COUNT.finditer(source)
    }
    up_to = {int(n) for source in code for n in UP_TO.findall(source)}
    if any("labs." in source and ".run()" in source for source in code):
        written |= {lab.world for lab in labs.LABS.values()}  # the labs spawn
    return written, up_to, any("cluster.start(" in source for source in code)


def _says(path: Path) -> str:
    """What the README's ranks column must say for a chapter's file."""
    if path.suffix == ".md":
        return "none (a page)"
    written, up_to, cluster = _counts(nbformat.read(path, as_version=4))
    if up_to and not written:
        return f"up to {max(up_to)} (one per GPU)"
    if cluster:  # the most at once: the GPUs a GPU box needs (bookrun.needed_ranks)
        return str(max(written))
    return " or ".join(str(n) for n in sorted(written)) + " (spawned)"


def test_the_readme_ranks_column_is_what_each_chapter_starts() -> None:
    rows = ROW.findall((ROOT / "README.md").read_text())
    assert len(rows) >= 15, rows
    wrong = [
        f"chapter {n}{x}: README says {says.strip()!r}, the notebook {_says(path)!r}"
        for n, x, says in rows
        if says.strip() != _says(path := _chapter_file(n, x))
    ]
    assert not wrong, wrong


def test_every_chapter_file_has_a_row() -> None:
    rows = {
        _chapter_file(n, x) for n, x, _ in ROW.findall((ROOT / "README.md").read_text())
    }
    chapters = {p for p in ROOT.glob("book/[0-9]*") if p.suffix in (".ipynb", ".md")}
    assert rows == chapters


def _exercise_modules() -> list[str]:
    return sorted(p.stem for p in (ROOT / "distcourse" / "exercises").glob("ch*.py"))


def _listed(items: list[str]) -> str:
    """'a, b and c', as the docs list things."""
    return ", ".join(items[:-1]) + f" and {items[-1]}" if len(items) > 1 else items[0]


def test_architecture_lists_the_exercise_modules() -> None:
    names = _exercise_modules()  # ch01 ... chNN with no gap, then the others
    run = 0
    while f"ch{run + 1:02d}" in names:
        run += 1
    rest = sorted(set(names) - {f"ch{n:02d}" for n in range(1, run + 1)})
    listed = f"ch01 ... ch{run:02d}, {_listed(rest)}"
    text = " ".join((ROOT / "ARCHITECTURE.md").read_text().split())
    assert listed in text, listed


def test_the_readme_names_the_chapters_with_exercises() -> None:
    chapters = []
    for name in _exercise_modules():
        number, topic = EXERCISE.fullmatch(name).groups()
        path = next(ROOT.glob(f"book/{int(number):02d}*_{topic}*")) if topic else None
        chapters.append(
            path.name.split("_")[0].lstrip("0") if path else str(int(number))
        )
    last = 0
    while str(last + 1) in chapters:  # chapters 1 to `last`, then the others
        last += 1
    others = sorted(set(chapters) - {str(n) for n in range(1, last + 1)})
    said = f"Chapters 1 to {last}, {_listed(others)} end with exercises"
    text = " ".join((ROOT / "README.md").read_text().split())
    assert said in text, said
