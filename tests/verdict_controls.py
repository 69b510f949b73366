"""Every verdict the book prints, and the negative control that shows it failing.

A verdict is a line a chapter prints ending in PASS or `: True`
(`distcourse.launch.bookrun.verdicts`). Its negative control is a test that runs the
same check on a planted fault and asserts FAIL or False, marked so this module can
find it without running anything:

    @pytest.mark.controls(
        "03_data_parallel",  # the notebook's stem, in book/
        r"TinyDDP\\s+max \\|4 ranks - one process\\|",  # re.search on a verdict line
        fault="gradients summed over ranks, not averaged",
    )
    def test_tinyddp_that_sums_fails() -> None: ...

A control file may instead declare the controls that only plant and check as a
table, `harness.Controls(stem, test_x=harness.Flip(faults, regex, fault, ...))`
(tests/controls/harness.py): each regex with its fault's words counts as a marker
of the test the table makes. Markers and tables are read from the source of every
test file (an AST walk), so their arguments must be literal strings.
tests/test_book_controls.py checks that every verdict of every stored notebook is
matched by a control of its notebook, and that every control matches one;
`python tests/verdict_controls.py` (`make checks-page`) writes the book's page
listing them, book/appendix_checks.md.
"""

from __future__ import annotations

import ast
import configparser
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbformat.v4 import new_notebook

from distcourse.launch import bookrun

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
TESTS = ROOT / "tests"
PAGE = BOOK / "appendix_checks.md"
REGENERATE = "make checks-page  (or: python tests/verdict_controls.py)"
RANK_TAG = re.compile(r"^\[(all ranks|rank \d+|ranks [\d, ]+)\]\s*")  # columns.show


class MarkerError(ValueError):
    """A `pytest.mark.controls` marker that cannot be read from the source."""


@dataclass(frozen=True)
class Control:
    """One `pytest.mark.controls` marker: which verdicts it fails, by which fault."""

    notebook: str  # stem of a notebook in book/
    pattern: str  # re.search on the notebook's verdict lines
    fault: str  # what the test plants
    test: str  # tests/...py::test_name
    where: str  # tests/...py:line, for error messages
    printed_on: str = ""  # where the verdict prints only on some machines: "2 GPUs"

    def matches(self, line: str) -> bool:
        return re.search(self.pattern, line) is not None


@dataclass(frozen=True)
class Verdict:
    """One PASS / True line of a stored notebook, and the code cell that printed it."""

    notebook: str
    cell: int  # index among all the notebook's cells, as nbformat counts them
    line: str


def _is_controls_marker(node: ast.expr) -> bool:
    """`pytest.mark.controls` (or `mark.controls` after `from pytest import mark`)."""
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "controls"
        and isinstance(node.value, ast.Attribute | ast.Name)
        and (getattr(node.value, "attr", None) or getattr(node.value, "id", ""))
        == "mark"
    )


def _literal(node: ast.expr, what: str, where: str) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    raise MarkerError(
        f"{where}: pytest.mark.controls takes literal strings only, so that the book's "
        f"table can be read from the source; its {what} is `{ast.unparse(node)}`"
    )


def _control(call: ast.Call, test: str, where: str) -> Control:
    """The Control one marker call describes; MarkerError if it is malformed."""
    keywords = {k.arg: k.value for k in call.keywords}
    if len(call.args) != 2 or set(keywords) - {"printed_on"} != {"fault"}:
        raise MarkerError(
            f"{where}: write pytest.mark.controls(notebook_stem, regex, fault=...), "
            f"(optionally printed_on=..., for a verdict only some machines print), "
            f"got `{ast.unparse(call)}`"
        )
    notebook, pattern = call.args
    return _read(notebook, pattern, keywords["fault"], keywords, test, where)


def _read(
    notebook: ast.expr,
    pattern: ast.expr,
    fault: ast.expr,
    keywords: dict[str | None, ast.expr],
    test: str,
    where: str,
) -> Control:
    """A Control from its literals (a marker's or a table's); MarkerError if one is
    not a literal string, the regex does not compile or the fault says nothing."""
    stem = _literal(notebook, "notebook", where)
    regex = _literal(pattern, "regex", where)
    words = _literal(fault, "fault", where)
    try:
        re.compile(regex)
    except re.error as err:
        raise MarkerError(f"{where}: regex {regex!r} does not compile: {err}") from None
    if not words.strip():
        raise MarkerError(f"{where}: fault= must say what the test plants")
    printed_on = ""
    if "printed_on" in keywords:
        printed_on = _literal(keywords["printed_on"], "printed_on", where)
    return Control(stem, regex, words.strip(), test, where, printed_on)


def _flips_in_table(call: ast.Call, path: str) -> list[tuple[int, Control]]:
    """The controls of one `harness.Controls(stem, test_x=harness.Flip(faults,
    regex, fault, ...), ...)` table: each regex with its fault's words, under the
    test the table makes (tests/controls/harness.py)."""
    where = f"{path}:{call.lineno}"
    if len(call.args) != 1 or not call.keywords:
        raise MarkerError(
            f"{where}: write harness.Controls(notebook_stem, test_name=Flip(...), "
            f"...), got `{ast.unparse(call)}`"
        )
    found = []
    for keyword in call.keywords:
        flip, test = keyword.value, keyword.arg or ""
        where = f"{path}:{flip.lineno}"
        if not test.startswith("test") or not (
            isinstance(flip, ast.Call) and _name(flip.func) == "Flip"
        ):
            raise MarkerError(
                f"{where}: a Controls table names each test (test_...) with a "
                f"harness.Flip(faults, regex, fault, ...), got `{ast.unparse(keyword)}`"
            )
        pairs = flip.args[1:]
        if not pairs or len(pairs) % 2:
            raise MarkerError(f"{where}: Flip's verdicts are (regex, fault) pairs")
        keywords = {k.arg: k.value for k in flip.keywords}
        for regex, fault in zip(pairs[::2], pairs[1::2], strict=True):
            control = _read(
                call.args[0], regex, fault, keywords, f"{path}::{test}", where
            )
            found.append((regex.lineno, control))
    return found


def _name(node: ast.expr) -> str:
    """What a call calls: `Flip` of `harness.Flip` or of `Flip`."""
    return getattr(node, "attr", None) or getattr(node, "id", "")


def controls_in(source: str, path: str) -> list[Control]:
    """The controls marked in one test file's `source` (`path` names it in messages),
    and those of its `harness.Controls` tables, in the order they are written.

    A marker must decorate a test function (a name starting with `test`): one written
    anywhere else (`pytestmark = ...`, a variable) is refused, not silently missed.
    """
    tree = ast.parse(source)
    decorates = {}  # id of a decorator expression -> what it decorates
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            decorates.update({id(d): node for d in node.decorator_list})
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    called = {id(n.func) for n in calls}
    found = []
    for node in ast.walk(tree):
        if not _is_controls_marker(node):
            continue
        where = f"{path}:{node.lineno}"
        if id(node) not in called:
            raise MarkerError(
                f"{where}: write pytest.mark.controls(...) with arguments"
            )
        call = next(c for c in calls if c.func is node)
        test = decorates.get(id(call))
        if not isinstance(test, ast.FunctionDef | ast.AsyncFunctionDef) or (
            not test.name.startswith("test")
        ):
            raise MarkerError(
                f"{where}: pytest.mark.controls is read only as the decorator of a "
                "test function (def test_...)"
            )
        found.append((node.lineno, _control(call, f"{path}::{test.name}", where)))
    for call in calls:
        if _name(call.func) == "Controls":
            found += _flips_in_table(call, path)
    return [control for _, control in sorted(found, key=lambda pair: pair[0])]


def find_controls(tests: Path = TESTS) -> list[Control]:
    """Every control marked in the test files under `tests`, in file order."""
    found = []
    for path in sorted(tests.rglob("*.py")):
        source = path.read_text()
        if "controls" in source.lower():  # pytest.mark.controls, harness.Controls
            found += controls_in(source, path.relative_to(tests.parent).as_posix())
    return found


def verdicts(path: Path) -> list[Verdict]:
    """The PASS / True lines of a stored notebook, cell by cell, as bookrun reads them.

    FAIL and False lines are left out: printed on purpose, they are the chapter's own
    negative controls.
    """
    nb = nbformat.read(path, as_version=4)
    found = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and cell.get("outputs"):
            passed, _ = bookrun.verdicts(new_notebook(cells=[cell]))
            found += [Verdict(path.stem, index, line) for line in passed]
    return found


def notebooks(book: Path = BOOK) -> list[Path]:
    """The chapters: every stored notebook in `book`."""
    return sorted(book.glob("*.ipynb"))


def uncovered(found: list[Verdict], controls: list[Control]) -> list[Verdict]:
    """The verdicts that no control of their notebook matches."""
    return [
        v
        for v in found
        if not any(c.notebook == v.notebook and c.matches(v.line) for c in controls)
    ]


def stale(controls: list[Control], found: list[Verdict]) -> list[Control]:
    """The controls that match no verdict line of their notebook. A control of a
    verdict printed only on some machines (`printed_on`, e.g. "2 GPUs") is not
    stale where the stored notebook, made on a CPU machine, lacks its line."""
    return [
        c
        for c in controls
        if not c.printed_on
        and not any(v.notebook == c.notebook and c.matches(v.line) for v in found)
    ]


def sanitizers(cfg: Path = BOOK / "nbval.cfg") -> list[tuple[re.Pattern[str], str]]:
    """book/nbval.cfg's masks (timings, bandwidths), as nbval applies them."""
    parser = configparser.ConfigParser()
    parser.read(cfg)
    return [
        (re.compile(parser[s]["regex"]), parser[s]["replace"])
        for s in parser.sections()
    ]


def shown(line: str, masks: list[tuple[re.Pattern[str], str]]) -> str:
    """A verdict line as the page shows it: without its rank tag ("[all ranks]"),
    with what nbval masks masked, so that re-executing a chapter leaves the page as
    it is."""
    line = RANK_TAG.sub("", line)
    for pattern, replace in masks:
        line = pattern.sub(replace, line)
    return line


def title(path: Path) -> str:
    """A chapter's short title: its first heading up to a colon ("3. Data ...")."""
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        for line in cell.source.splitlines() if cell.cell_type == "markdown" else []:
            if line.startswith("# "):
                return line[2:].split(":")[0].strip()
    return path.stem


HEADER = """\
# Every check in this book, and the fault that fails it

The chapters print verdicts: lines that end in PASS, or in `: True`, where a run is
compared with one process, with PyTorch's own collective, or with a formula. A check
that could not fail would prove nothing, so each verdict has a negative control: a
test that runs the same check on a planted fault (a ring with a chunk off by one, a
DDP that sums gradients instead of averaging them, a stale checkpoint) and shows it
print FAIL or False. A FAIL or False that a chapter prints on purpose is a control
already, and is not listed.

Below, chapter by chapter: each verdict as the stored notebook prints it (with
timings masked, as the notebook tests mask them), the fault planted, and the test in
`tests/` that shows the check failing. The page is generated from the tests' markers
and the stored notebooks by `python tests/verdict_controls.py`;
`tests/test_book_controls.py` fails when a verdict has no control, when a control
matches no verdict, or when this page is out of date.
"""


def _code(text: str) -> str:
    """`text` as inline code, whatever backticks it holds."""
    fence = "``" if "`" in text else "`"
    pad = " " if fence == "``" else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _cell(items: list[str]) -> list[str]:
    """The lines of one list-table cell: one item as it is, several as a list."""
    if len(items) == 1:
        return [f"  - {items[0]}"]
    return ["  - " + "\n    ".join(f"* {item}" for item in items)]


def chapter_table(path: Path, controls: list[Control], masks: list) -> list[str]:
    """One chapter's section: its verdicts, each with its faults and tests."""
    rows: dict[str, list[Control]] = {}  # shown text -> the controls that match it
    for v in verdicts(path):
        mine = rows.setdefault(shown(v.line, masks), [])
        mine += [c for c in controls if c.notebook == v.notebook and c.matches(v.line)]
    if not rows:
        return []
    lines = [
        f"## {title(path)}",
        "",
        "```{list-table}",
        ":header-rows: 1",
        ":widths: 40 32 28",
        ":class: dc-checks",
        "",
        "* - verdict, as printed",
        "  - planted fault",
        "  - test that shows it failing",
    ]
    for text, mine in rows.items():
        lines.append(f"* - {_code(text)}")
        faults = dict.fromkeys(c.fault for c in mine)  # each once, in test order
        tests = dict.fromkeys(_code(c.test.removeprefix("tests/")) for c in mine)
        lines += _cell(list(faults) or ["no control yet"])
        lines += _cell(list(tests) or ["\u2014"])
    return [*lines, "```", ""]


def page(book: Path = BOOK, tests: Path = TESTS) -> str:
    """The text of book/appendix_checks.md for the notebooks and tests as they are."""
    controls, masks = find_controls(tests), sanitizers(book / "nbval.cfg")
    lines = [HEADER]
    for path in notebooks(book):
        lines += chapter_table(path, controls, masks)
    return "\n".join(lines).rstrip("\n") + "\n"


def main() -> int:
    """Write book/appendix_checks.md."""
    PAGE.write_text(page())
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
