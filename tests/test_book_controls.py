"""Every verdict the book prints has a negative control, and the book lists them.

A verdict (a line ending in PASS or `: True`) is only worth printing if the check
behind it could print FAIL. For each one, a test marked `pytest.mark.controls(...)`
runs that check on a planted fault and shows it failing (tests/controls/). Here:
each verdict of each stored notebook is matched by a control of its notebook, each
control matches a verdict, the markers are well formed, and the page that lists
them all (book/appendix_checks.md) is what its generator writes today.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import verdict_controls as vc

ROOT = Path(__file__).resolve().parents[1]

GOOD = """
import pytest

@pytest.mark.controls("03_data_parallel", r"TinyDDP\\s+max", fault="sums")
@pytest.mark.controls("03_data_parallel", r"our DDP", fault="sums, too")
def test_it() -> None: ...
"""


def test_markers_are_read_from_the_source_with_their_test() -> None:
    first, second = vc.controls_in(GOOD, "tests/controls/test_x.py")
    assert first == vc.Control(
        "03_data_parallel",
        r"TinyDDP\s+max",
        "sums",
        "tests/controls/test_x.py::test_it",
        "tests/controls/test_x.py:4",
    )
    assert second.pattern == "our DDP" and second.fault == "sums, too"
    assert first.matches("[rank 0] TinyDDP    max |4 ranks - one process| PASS")


def test_a_verdict_printed_only_on_some_machines_is_not_stale_where_absent() -> None:
    source = (
        '@pytest.mark.controls("04", "two devices", fault="f", printed_on="2 GPUs")\n'
        '@pytest.mark.controls("04", "one device", fault="f")\n'
        "def test_a(): ..."
    )
    gpu_only, everywhere = vc.controls_in(source, "test_z.py")
    assert gpu_only.printed_on == "2 GPUs" and everywhere.printed_on == ""
    assert vc.stale([gpu_only, everywhere], []) == [everywhere]


TABLE = """
CONTROLS = harness.Controls(
    "03_data_parallel",
    test_it=harness.Flip(
        ["summing"],
        r"TinyDDP\\s+max",
        "sums",
        r"our DDP",
        " sums, too ",
        printed_on="2 GPUs",
    ),
    test_too=harness.Flip(["summing"], r"by hand", "sums by hand", each=True),
)
@pytest.mark.controls("03_data_parallel", r"torch DDP", fault="a hook that sums")
def test_marked() -> None: ...
"""


def test_a_controls_table_is_read_with_its_tests_in_source_order() -> None:
    found = vc.controls_in(TABLE, "tests/controls/test_x.py")
    assert found[0] == vc.Control(
        "03_data_parallel",
        r"TinyDDP\s+max",
        "sums",
        "tests/controls/test_x.py::test_it",
        "tests/controls/test_x.py:4",
        "2 GPUs",
    )
    assert [(c.pattern, c.fault, c.test.split("::")[1]) for c in found[1:]] == [
        ("our DDP", "sums, too", "test_it"),
        ("by hand", "sums by hand", "test_too"),
        ("torch DDP", "a hook that sums", "test_marked"),
    ]


# a marker the AST walk cannot read, and the words its error must say
UNREADABLE = [
    ('STEM = "01"\n@pytest.mark.controls(STEM, "x", fault="f")\ndef test_a(): ...',
     "literal strings only"),
    ('@pytest.mark.controls("01", "x", fault=f"{1}")\ndef test_a(): ...',
     "literal strings only"),
    ('@pytest.mark.controls("01", "x")\ndef test_a(): ...', "fault=..."),
    ('@pytest.mark.controls("01", "(", fault="f")\ndef test_a(): ...',
     "does not compile"),
    ('@pytest.mark.controls("01", "x", fault=" ")\ndef test_a(): ...',
     "what the test plants"),
    ('@pytest.mark.controls("01", "x", fault="f")\ndef helper(): ...',
     "test function"),
    ('pytestmark = pytest.mark.controls("01", "x", fault="f")', "test function"),
    ("@pytest.mark.controls\ndef test_a(): ...", "with arguments"),
    ('harness.Controls("01", test_a=Flip(["f"], "x"))', "pairs"),
    ('harness.Controls("01", helper=Flip(["f"], "x", "f"))', "names each test"),
    ('harness.Controls("01", test_a=Plant(["f"], "x", "f"))', "names each test"),
    ('harness.Controls(STEM, test_a=Flip(["f"], "x", "f"))', "literal strings only"),
    ('harness.Controls("01", test_a=Flip(["f"], "(", "f"))', "does not compile"),
    ('harness.Controls("01", test_a=Flip(["f"], "x", " "))', "what the test plants"),
    ('harness.Controls("01")', "test_name=Flip"),
]  # fmt: skip  # table


@pytest.mark.parametrize("source, words", UNREADABLE)
def test_a_marker_that_cannot_be_read_is_an_error(source: str, words: str) -> None:
    with pytest.raises(vc.MarkerError, match=f"test_y.py:.*{words}"):
        vc.controls_in(source, "test_y.py")


def test_the_controls_marker_is_registered() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    markers = config["tool"]["pytest"]["ini_options"]["markers"]
    assert any(m.startswith("controls(") for m in markers)


@pytest.fixture(scope="module")
def controls() -> list[vc.Control]:
    """Every control marked in tests/; a marker that cannot be read fails here."""
    try:
        return vc.find_controls()
    except vc.MarkerError as err:
        pytest.fail(str(err), pytrace=False)


NOTEBOOKS = vc.notebooks()


def test_every_control_names_a_notebook_of_the_book(
    controls: list[vc.Control],
) -> None:
    stems = {path.stem for path in NOTEBOOKS}
    lost = [
        f"{c.where}: no book/{c.notebook}.ipynb"
        for c in controls
        if c.notebook not in stems
    ]
    assert not lost, "controls of notebooks that do not exist:\n" + "\n".join(lost)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.stem)
def test_every_verdict_has_a_negative_control(
    path: Path, controls: list[vc.Control]
) -> None:
    found = vc.verdicts(path)
    mine = [c for c in controls if c.notebook == path.stem]
    missing = [f"  cell {v.cell}: {v.line}" for v in vc.uncovered(found, mine)]
    unused = [f"  {c.where}: {c.pattern!r}" for c in vc.stale(mine, found)]
    problems = []
    if missing:
        problems += [
            f"{path.name}: {len(missing)} of {len(found)} verdicts have no negative "
            f'control (a test marked pytest.mark.controls("{path.stem}", regex, '
            "fault=...) whose regex matches the line; see tests/verdict_controls.py):",
            *missing,
        ]
    if unused:
        problems += [
            f"{path.name}: controls whose regex matches none of its verdict lines "
            "(stale: the chapter changed its line, or the regex is wrong):",
            *unused,
        ]
    if problems:  # the lines themselves, not a diff of lists
        pytest.fail("\n".join(problems), pytrace=False)


def test_the_book_page_lists_every_control_as_they_are_now() -> None:
    written = vc.PAGE.read_text() if vc.PAGE.exists() else ""
    if written != vc.page():
        pytest.fail(
            f"{vc.PAGE.relative_to(ROOT)} is not what its generator writes now: "
            f"regenerate it with `{vc.REGENERATE}` and commit it",
            pytrace=False,
        )
