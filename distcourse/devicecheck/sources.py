"""Which files the device check reads, and the rank code in each.

A script or a package module is rank code as a whole. In a notebook, rank code is
each `%%px` / `%%ranks` cell (its magic line blanked, so line numbers are the cell's
own) and, in the other cells, the functions the notebook hands to `spawn`.
"""

from __future__ import annotations

import ast
import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path

from distcourse.devicecheck.rules import Checker, Refusal, Unit

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_PATHS = ("book", "book/scripts", "distcourse")
RANK_MAGICS = ("%%px", "%%ranks")
USAGE = (
    "usage: python -m distcourse.devicecheck [PATH ...]\n"
    "Refuses host tensors sent by collectives and literal 'cpu' device types in rank\n"
    "code (notebook rank cells, scripts, modules); default paths: "
    + ", ".join(DEFAULT_PATHS)
)
SKIP_DIRS = frozenset({".ipynb_checkpoints", "_build", "__pycache__", ".venv", "data"})


def files(paths: Iterable[str | Path]) -> list[Path]:
    """The .py and .ipynb files at or under `paths`, each once, in order."""
    found: dict[Path, None] = {}
    for path in map(Path, paths):
        if not path.exists():
            raise FileNotFoundError(f"devicecheck: no such file or folder: {path}")
        inside = sorted(path.rglob("*")) if path.is_dir() else [path]
        for f in inside:
            skipped = SKIP_DIRS.intersection(f.parts)
            if f.suffix in (".py", ".ipynb") and f.is_file() and not skipped:
                found.setdefault(f, None)
    return list(found)


def _code(source: str) -> str:
    """A cell's source with IPython's magics and shell lines blanked (same lines)."""
    keep = [
        "" if line.lstrip().startswith(("%", "!")) else line
        for line in source.splitlines()
    ]
    return "\n".join(keep)


def _spawned(trees: Iterable[ast.Module]) -> frozenset[str]:
    """Names of the functions passed to `spawn(fn, ...)` anywhere in the notebook."""
    names = set()
    for tree in trees:
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            func, first = node.func, node.args[0]
            called = (
                func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            )
            if called == "spawn" and isinstance(first, ast.Name):
                names.add(first.id)
    return frozenset(names)


def notebook_units(path: Path) -> tuple[list[Unit], list[Refusal]]:
    """A notebook's rank code, and a refusal for each rank cell that will not parse."""
    units, kernel, unreadable = [], [], []
    cells = json.loads(path.read_text())["cells"]
    for index, cell in enumerate(cells):
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        on_ranks = source.lstrip().startswith(RANK_MAGICS)
        code = _code(source)
        try:
            tree = ast.parse(code)
        except SyntaxError as err:
            if on_ranks:
                message = f"rank cell does not parse: {err.msg}"
                unreadable.append(Refusal(str(path), index, err.lineno or 1, message))
            continue
        unit = Unit(tree, code.splitlines(), index)
        (units if on_ranks else kernel).append(unit)
    spawned = _spawned(u.tree for u in units + kernel)
    for unit in kernel:
        unit.only = spawned
    return sorted(units + kernel, key=lambda u: u.cell or 0), unreadable


def check_file(path: Path, shown: str | None = None) -> list[Refusal]:
    """Every refusal in one file; `shown` is the path as printed."""
    shown = shown or str(path)
    if path.suffix == ".ipynb":
        units, refusals = notebook_units(path)
    else:
        source = path.read_text()
        try:
            units, refusals = [Unit(ast.parse(source), source.splitlines())], []
        except SyntaxError as err:
            units = []
            refusals = [Refusal(str(path), None, err.lineno or 1, err.msg)]
    found = Checker(shown, units).run() + refusals
    return [Refusal(shown, r.cell, r.line, r.message) for r in found]


def _shown(path: Path) -> str:
    """`path` relative to the working directory where it lies under it."""
    relative = os.path.relpath(path)
    return path.as_posix() if relative.startswith("..") else relative


def check_paths(paths: Iterable[str | Path] | None = None) -> list[Refusal]:
    """Every refusal under `paths` (default: book/, book/scripts/, distcourse/)."""
    if paths is None:
        paths = [ROOT / p for p in DEFAULT_PATHS]
    return [r for f in files(paths) for r in check_file(f, _shown(f))]


def main(argv: list[str] | None = None) -> int:
    """The command line: print each refusal; 1 if any, 0 if none, 2 on a bad path."""
    argv = list(argv if argv is not None else sys.argv[1:])
    if any(a in ("-h", "--help") for a in argv):
        print(USAGE)
        return 0
    try:
        refusals = check_paths(argv or None)
    except FileNotFoundError as err:
        print(err, file=sys.stderr)
        return 2
    for refusal in refusals:
        print(refusal)
    if refusals:
        print(f"devicecheck: {len(refusals)} refusal(s)", file=sys.stderr)
    return 1 if refusals else 0
