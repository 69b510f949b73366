"""The architecture is a test: layers, rank-side code, strategy independence, sizes.

The import rules live in pyproject.toml ([tool.importlinter]) and are checked by
import-linter; the rules it cannot express (no private name crosses a module, no
module over 300 lines of code, no `# fmt: skip` except on a literal table (in the
package, the tests and the notebooks' code cells),
strategies do not import each other) are an AST walk here.
ARCHITECTURE.md explains the layers these tests hold in place.
"""

from __future__ import annotations

import ast
import io
import json
import re
import shutil
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "distcourse"
MAX_CODE_LINES = 300  # lines of code: not blank, not a comment, not a docstring
# modules of distcourse/parallel/ that are building blocks, not strategies
SHARED = {"__init__", "replicas", "buckets", "compat", "hybrid"}


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _python_sources() -> list[Path]:
    scripts = sorted((ROOT / "book").rglob("*.py"))
    return _modules() + sorted((ROOT / "tests").rglob("*.py")) + scripts


def _notebook_code(path: Path) -> str:
    cells = json.loads(path.read_text())["cells"]
    code = ("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    lines = [ln for src in code for ln in src.splitlines() if not ln.startswith("%")]
    return "\n".join(lines)


def _notebook_cells(path: Path) -> list[tuple[int, str]]:
    """(index, source) of each code cell, its IPython magic lines (`%...`) blanked.

    Blank, not dropped: a finding's line number stays the line in the cell.
    """
    cells = json.loads(path.read_text())["cells"]
    return [
        (i, re.sub(r"^%.*$", "", "".join(cell["source"]), flags=re.MULTILINE))
        for i, cell in enumerate(cells)
        if cell["cell_type"] == "code"
    ]


def test_import_linter_contracts_hold() -> None:
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint, "import-linter is not installed: make venv"
    done = subprocess.run(
        [lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]


DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def _docstring_lines(tree: ast.AST) -> set[int]:
    """The lines of the module's, each class's and each function's docstring."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, DOCUMENTED):
            first = node.body[0] if node.body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                lines.update(range(first.lineno, first.end_lineno + 1))
    return lines


def code_lines(source: str) -> int:
    """How many lines hold code: not blank, not only a comment, not a docstring.

    The size rule counts ideas, not layout: a docstring that explains, a comment or
    a blank line between steps never pushes a module over it, and packing code onto
    fewer lines never helps it under.
    """
    layout = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT}
    layout |= {tokenize.DEDENT, tokenize.ENCODING, tokenize.ENDMARKER}
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in layout:
            lines.update(range(token.start[0], token.end[0] + 1))
    return len(lines - _docstring_lines(ast.parse(source)))


# 7 lines of code: X = [, 1, ], class A:, def f, return """..., no docstring"""
SAMPLE = '''"""Module docstring,
on two lines."""

# a comment
X = [
    1,  # a trailing comment: the line holds code
]


class A:
    """Class docstring."""

    def f(self) -> str:
        """Function docstring,

        with a paragraph.
        """
        return """a string that is
no docstring"""
'''


def test_code_lines_count_neither_docstrings_comments_nor_blanks() -> None:
    assert code_lines(SAMPLE) == 7


@pytest.mark.parametrize("path", _modules(), ids=lambda p: _name(p))
def test_no_module_is_longer_than_a_chapter_can_show(path: Path) -> None:
    lines = code_lines(path.read_text())
    assert lines <= MAX_CODE_LINES, (
        f"{_name(path)} has {lines} lines of code (at most {MAX_CODE_LINES}): "
        "split it by idea (a strategy that needs more becomes a folder)"
    )


TABLE = "# fmt: skip  # table"  # the one way to keep ruff format off a statement
FORMAT_PRAGMA = re.compile(r"(fmt|yapf)\s*:\s*(skip|off|on|disable|enable)")


def _is_literal_table(node: ast.stmt | None) -> bool:
    """An assignment of a list, tuple, dict or set of constants (ast.literal_eval)."""
    if not isinstance(node, ast.Assign | ast.AnnAssign):
        return False
    if not isinstance(node.value, ast.List | ast.Tuple | ast.Dict | ast.Set):
        return False
    try:
        ast.literal_eval(node.value)
    except ValueError:
        return False
    return True


def format_skips(source: str) -> list[str]:
    """Each formatter pragma of `source` that is not a literal table marked `TABLE`.

    `ruff format` decides the layout; a statement may keep its own only when it is
    data whose rows mean something (a table of constants), never to pack code.
    """
    tree = ast.parse(source)
    ends: dict[int, ast.stmt] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt) and node.end_lineno not in ends:
            ends[node.end_lineno] = node  # the outermost statement ending there
    found = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT and FORMAT_PRAGMA.search(token.string):
            line = token.start[0]
            if token.string != TABLE:
                found.append(f"line {line}: {token.string!r} (only {TABLE!r})")
            elif not _is_literal_table(ends.get(line)):
                found.append(f"line {line}: marks no assignment of literal data")
    return found


def test_format_skips_are_only_for_literal_tables() -> None:
    sample = "X = {\n  'a': 1, 'b': 2,\n}  # fmt: skip  # table\n"
    assert format_skips(sample) == []
    for bad in (
        "x = f(1,\n      2)  # fmt: skip  # table\n",  # code, not data
        "X = [f(1), 2]  # fmt: skip  # table\n",  # a call is not a constant
        "X = [1,  2]  # fmt: skip\n",  # unmarked
        "# fmt: off\nX = [1,  2]\n# fmt: on\n",
    ):
        assert format_skips(bad), bad
    offences = [
        f"{path.relative_to(ROOT)} {skip}"
        for path in _modules()
        + sorted((ROOT / "tests").rglob("*.py"))
        + sorted((ROOT / "book").rglob("*.py"))  # the scripts the chapters run
        for skip in format_skips(path.read_text())
    ]
    assert not offences, "formatter pragmas on code, not tables:\n" + "\n".join(
        offences
    )


def test_notebook_cells_keep_format_skips_for_literal_tables() -> None:
    """The same rule for the book's code cells: a reader sees what ruff lays out."""
    cell = "%%ranks\nfor x in [1,\n          2]:  # fmt: skip\n    print(x)\n"
    assert format_skips(re.sub(r"^%.*$", "", cell, flags=re.MULTILINE))
    offences = [
        f"{path.relative_to(ROOT)} cell {i}, {skip}"
        for path in sorted((ROOT / "book").glob("*.ipynb"))
        for i, source in _notebook_cells(path)
        for skip in format_skips(source)
    ]
    assert not offences, "formatter pragmas on code, not tables:\n" + "\n".join(
        offences
    )


def _private_uses(tree: ast.AST, own: str) -> list[str]:
    """`from distcourse.x import _y` and `x._y` (x a distcourse module) outside x."""
    found, aliases = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "distcourse"
        ):
            for alias in node.names:
                if alias.name.startswith("_") and node.module != own:
                    found.append(f"from {node.module} import {alias.name}")
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("distcourse"):
                    aliases[alias.asname or alias.name] = alias.name
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and aliases[node.value.id] != own
        ):
            found.append(f"{node.value.id}.{node.attr}")
    return found


def test_no_private_name_is_used_outside_its_module() -> None:
    offences = []
    for path in _python_sources():
        own = _name(path) if path.is_relative_to(PACKAGE) else ""
        for use in _private_uses(ast.parse(path.read_text()), own):
            offences.append(f"{path.relative_to(ROOT)}: {use}")
    for path in sorted((ROOT / "book").glob("*.ipynb")):
        for use in _private_uses(ast.parse(_notebook_code(path)), ""):
            offences.append(f"{path.relative_to(ROOT)}: {use}")
    assert not offences, "private names used outside their module:\n" + "\n".join(
        offences
    )


def _strategies() -> dict[str, Path]:
    """distcourse.parallel's strategies: modules and folders, minus building blocks."""
    found = {}
    for path in sorted((PACKAGE / "parallel").iterdir()):
        name = path.stem if path.suffix == ".py" else path.name
        if name not in SHARED and (path.suffix == ".py" or path.is_dir()):
            found[f"distcourse.parallel.{name}"] = path
    return found


def _imports(path: Path) -> set[str]:
    files = [path] if path.is_file() else sorted(path.rglob("*.py"))
    names: set[str] = set()
    for file in files:
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
                names.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
    return names


def test_strategies_do_not_import_each_other() -> None:
    strategies = _strategies()
    assert "distcourse.parallel.ddp" in strategies
    for name, path in strategies.items():
        others = {s for s in strategies if s != name}
        used = {
            i for i in _imports(path) for s in others if i == s or i.startswith(s + ".")
        }
        assert not used, f"{name} imports other strategies: {sorted(used)}"


def test_global_tensors_do_not_import_strategies() -> None:
    used = {
        i
        for i in _imports(PACKAGE / "global_tensor")
        if i.startswith("distcourse.parallel")
    }
    assert not used, f"distcourse.global_tensor imports {sorted(used)}"
