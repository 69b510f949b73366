"""The one harness of the book's negative controls: plant a fault in the code under
test, run the chapter's own cells (or a function) on spawned ranks, and check that
the verdict lines a control names flip from PASS as written to FAIL planted.

A control file says what to run and what to break; the harness does the rest:

    CHAPTER = harness.Chapter("09_zero_fsdp", setup=["REF = {kind"])
    FAULTS = {
        "share": harness.Fault(
            ["ZeRO-1's formula"],  # the cells to run: a text each one contains
            harness.Plant(partition, "owners", _all_mine),  # what it replaces
        ),
    }

    @pytest.fixture(scope="module")
    def ran() -> harness.Ran:
        return CHAPTER.run(FAULTS)

    CONTROLS = harness.Controls(
        "09_zero_fsdp",
        test_a_rank_that_owns_everything_fails=harness.Flip(
            ["share"], r"ZeRO-1's formula", "each rank owns every parameter"
        ),
    )
    globals().update(CONTROLS.tests())

`Chapter.run` spawns the notebook's ranks once for the whole file. On every rank,
for each distinct list of cells, the cells run once as written, then once under each
fault that names them: a fresh namespace each time (the names a `%%ranks` cell sees,
`cluster.NAMESPACE`), the chapter's setup cells, then the cells, with each `Plant`
set on every rank (and undone after) and each `Swap` applied to the cells' text.
Each cell's output is folded across ranks as `%%ranks` shows it ("[all ranks] ...",
"[rank 1] ..."), so a control's regex is the one that matches the stored notebook.
A cell without `%%ranks` runs in this process after the ranks are done, and
`ranks.pull(name, rank)` there reads the value that rank's cells left (`Pulled`);
ranks it starts itself (`spawn(fn, n)`) run `fn` under the same plants.
A chapter with no ranks (`ranks=0`) runs every cell in this process.

Each `Flip` of the file's `Controls` table becomes a test of that name: for each
of its verdicts' regexes, some line of the run as written matching it must be a
PASS (or True), and each verdict it matches in the planted run (the same words, the
numbers aside) must say FAIL (or False) on some rank (`assert_flips`). The regex is
written for the passing line; a failing one matches it with its last word turned
back. A control that does more (judges a stored run: `stored_flips`; shows what a
check cannot see: `assert_holds`) is a function marked `pytest.mark.controls`.

`run_function` gives a function the same treatment: as written and under each fault,
in one spawn (or in this process), its printed lines folded the same way.
"""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from distcourse import launch
from distcourse.launch import cluster, spawn
from distcourse.launch.columns import RankOutput, split_lines
from distcourse.launch.script import swapped

BOOK = Path(__file__).resolve().parents[2] / "book"
WRITTEN = "as written"  # the run with no fault planted
MAGIC = re.compile(r"^%%(ranks|px)\b")
PULL = re.compile(r"""ranks\.pull\(\s*["'](\w+)["']""")
LAST_WORD = re.compile(r"(PASS|FAIL|True|False)\s*$")
FAILED = re.compile(r"= \S+ > (\S+): FAIL\b")  # checks.verdict's FAIL, anywhere


@dataclass(frozen=True)
class Plant:
    """`owner.name` (a module's function, a class's method, an object's attribute)
    replaced by `fake` on every rank while a fault runs: the fault in the code under
    test. With `wrap=True`, `fake` is called with the real one and returns the
    replacement (a fault that changes what the real function returns)."""

    owner: object
    name: str
    fake: object
    wrap: bool = False


@dataclass(frozen=True)
class Swap:
    """One line of the chapter's cells (`old`, exactly once, as written) replaced by
    `new`: a fault in the chapter's own code."""

    old: str
    new: str


class Code(str):
    """A line a control runs among a chapter's cells, as it is (not a cell's text to
    find): what a cell left out of the run would have bound, said plainly."""


@dataclass(frozen=True)
class Fault:
    """What a control runs and what it breaks: `cells`, a text that each cell to run
    contains (in order; a chapter's setup runs first; a `Code` runs as it is), and
    the plants and swaps."""

    cells: Sequence[str]
    plants: tuple[Plant | Swap, ...] = ()

    def __init__(self, cells: Sequence[str], *plants: Plant | Swap) -> None:
        object.__setattr__(self, "cells", tuple(cells))
        object.__setattr__(self, "plants", plants)


@contextlib.contextmanager
def planted(plants: Sequence[Plant | Swap]) -> Iterator[None]:
    """Every Plant of `plants` set for the block, then undone (in reverse order)."""
    undo = []
    try:
        for plant in plants:
            if isinstance(plant, Plant):
                real = getattr(plant.owner, plant.name)
                fake = plant.fake(real) if plant.wrap else plant.fake
                undo.append((plant.owner, plant.name, real))
                setattr(plant.owner, plant.name, fake)
        yield
    finally:
        for owner, name, real in reversed(undo):
            setattr(owner, name, real)


def with_swaps(sources: list[str], plants: Sequence[Plant | Swap]) -> list[str]:
    """`sources` with every Swap applied; a swap must change exactly one line of
    exactly one cell (a swap that changed nothing would compare a cell with itself)."""
    out = list(sources)
    for swap in (p for p in plants if isinstance(p, Swap)):
        hits = [i for i, text in enumerate(out) if swap.old in text.splitlines()]
        if len(hits) != 1:
            raise ValueError(f"swap {swap.old!r}: in {len(hits)} cells, not one")
        out[hits[0]] = swapped(out[hits[0]], (swap.old, swap.new))
    return out


def captured(run: Callable[[], object]) -> list[str]:
    """The lines `run` printed (stdout and stderr), as a terminal shows them."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        run()
    return split_lines(out.getvalue())


def _close_figures() -> None:
    import sys

    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close("all")


def run_cells(sources: list[str], namespace: dict[str, Any]) -> list[list[str]]:
    """Run `sources` one after another in `namespace`; each cell's printed lines."""
    outputs = []
    for source in sources:
        code = compile(source, "<cell>", "exec")
        outputs.append(captured(lambda code=code: exec(code, namespace)))
        _close_figures()
    return outputs


def _on_rank(prelude: str, programs: list[tuple[list[str], tuple, list[str]]]):
    """On a rank, each program (its cells, plants, and the names its kernel cells
    pull) in a new namespace with a `%%ranks` cell's names: each cell's printed
    lines, and the values of the names to pull."""
    found = []
    for sources, plants, names in programs:
        namespace: dict[str, Any] = {"__name__": "__main__"}
        exec(cluster.NAMESPACE + prelude, namespace)
        with planted(plants), contextlib.chdir(BOOK):  # where the notebook runs
            outputs = run_cells(sources, namespace)
        found.append((outputs, {n: namespace[n] for n in names if n in namespace}))
    return found


@dataclass
class Pulled:
    """`ranks` for a chapter's kernel cells: `pull(name, rank)` reads what that
    rank's cells left in the harness's run."""

    values: list[dict[str, Any]]

    @property
    def world_size(self) -> int:
        return len(self.values)

    def pull(self, name: str, rank: int = 0) -> Any:
        return self.values[rank][name]


@dataclass
class Ran:
    """The printed lines of each run, as written and under each fault."""

    lines: dict[str, list[str]] = field(default_factory=dict)
    world: int = 0  # the ranks that printed them ("[all ranks]" is each of them)
    written_of: dict[str, str] = field(default_factory=dict)  # fault -> its baseline

    def written(self, fault: str) -> list[str]:
        return self.lines[self.written_of.get(fault, WRITTEN)]


def positive(line: str) -> str:
    """`line` with a failing verdict turned back into the passing one it replaces
    (what the marker's regex matches): checks.verdict's "= 2.0e-01 > 1e-05: FAIL"
    into "<= 1e-05: PASS", a last word FAIL or False into PASS or True."""
    line = FAILED.sub(r"<= \1: PASS", line)
    turned = {"FAIL": "PASS", "False": "True"}
    return LAST_WORD.sub(lambda m: turned.get(m[1], m[1]), line)


def failing(line: str) -> bool:
    """A FAIL or False at the end, or one of checks.verdict's FAILs anywhere (a line
    with two verdicts: "column == ... : FAIL; row == Y <= 1e-06: PASS")."""
    last = LAST_WORD.search(line)
    return bool(last and last[1] in ("FAIL", "False")) or bool(FAILED.search(line))


def by_printer(lines: list[str], world: int) -> dict[str, list[str]]:
    """Each printer's lines, in order: a rank's ("[rank 1] ...", and every "[all
    ranks] ..." line, which each of the `world` ranks printed), or this process's
    (no tag)."""
    from verdict_controls import RANK_TAG  # in this process only (see Chapter)

    out: dict[str, list[str]] = {}
    for line in lines:
        tag = RANK_TAG.match(line)
        who = tag[1] if tag else "here"
        if who == "all ranks":  # world 0: ranks a kernel cell started (columns.show)
            printers = [f"rank {r}" for r in range(world)] or [who]
        elif who.startswith("ranks "):
            printers = [f"rank {r.strip()}" for r in who[6:].split(",")]
        else:
            printers = [who]
        for printer in printers:
            out.setdefault(printer, []).append(line)
    return out


def assert_flips(
    ran: Ran, faults: Sequence[str], pattern: str, printed_on: str = ""
) -> None:
    """The verdicts `pattern` matches: a PASS as written, a FAIL under the faults.

    A verdict is the k-th line matching `pattern` that each printer printed (the
    same print on every rank): it fails if it says FAIL or False on some rank under
    one of `faults` (several faults may share a check's verdicts between them: each
    of a table's rows failed by one fault or another)."""
    missing = [f for f in faults if f not in ran.lines]
    if missing:
        raise KeyError(f"faults never run: {missing}; run: {sorted(ran.lines)}")
    for fault in faults:
        written = [ln for ln in ran.written(fault) if re.search(pattern, ln)]
        if not printed_on:
            assert [ln for ln in written if not failing(ln)], (
                f"as written, no passing line matches {pattern!r}:\n"
                + "\n".join(ran.written(fault))
            )
    verdicts: dict[int, list[str]] = {}
    for fault in faults:
        for mine in by_printer(ran.lines[fault], ran.world).values():
            hits = [ln for ln in mine if re.search(pattern, positive(ln))]
            for k, line in enumerate(hits):
                verdicts.setdefault(k, []).append(line)
    assert verdicts, f"under {faults}, no line matches {pattern!r}"
    held = [lines for lines in verdicts.values() if not any(map(failing, lines))]
    assert not held, f"under {faults}, verdicts that still pass:\n" + "\n".join(
        lines[0] for lines in held
    )


@dataclass
class Chapter:
    """A notebook's cells, run by the harness: `setup`, the texts of the cells every
    run starts with (imports, helpers), and `ranks` (default: the count its
    `cluster.start(N)` writes; 0 runs every cell in this process).

    `stored=True` takes the lines as written from the notebook's stored outputs of
    the same cells instead of running them again (what nbval checks they still
    print): for a chapter whose cells take long, it halves the work."""

    stem: str
    setup: Sequence[str] = ()
    prelude: str = ""  # code each rank runs before the cells (imports)
    here: str = ""  # code run here before the kernel cells (imports)
    ranks: int | None = None
    timeout: float = 60.0
    stored: bool = False

    def read(self) -> None:
        """The notebook's code cells and what each printed; read when the chapter
        first runs, not when a control module is imported (as its ranks do)."""
        if hasattr(self, "sources"):
            return
        import nbformat  # seconds to import: in this process only

        from distcourse.launch import bookrun

        nb = nbformat.read(BOOK / f"{self.stem}.ipynb", as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        self.sources = [c.source for c in code]
        self.printed = {c.source: printed(c) for c in code}
        if self.ranks is None:
            self.ranks = bookrun.written_ranks(nb)

    def cell(self, text: str) -> str:
        """The one code cell whose source contains `text` (a Code: itself)."""
        if isinstance(text, Code):
            return str(text)
        self.read()
        hits = [s for s in self.sources if text in s]
        if len(hits) != 1:
            raise ValueError(f"{self.stem}: {len(hits)} code cells contain {text!r}")
        return hits[0]

    def run(self, faults: dict[str, Fault]) -> Ran:
        """Every distinct list of cells as written, and each fault: one spawn."""
        self.read()
        runs: dict[str, tuple[list[str], tuple]] = {}
        ran = Ran(world=self.ranks or 0)
        baselines: dict[tuple[str, ...], str] = {}
        for name, fault in faults.items():
            cells = [self.cell(t) for t in fault.cells]
            on_ranks = any(MAGIC.match(c) for c in cells)  # else no rank setup
            setup = [self.cell(t) for t in self.setup]
            cells = [c for c in setup if on_ranks or not MAGIC.match(c)] + cells
            key = tuple(fault.cells)
            if key not in baselines:
                baselines[key] = f"{WRITTEN} {len(baselines)}"
                if self.stored:
                    ran.lines[baselines[key]] = [
                        line for c in cells for line in self.printed.get(c, [])
                    ]
                else:
                    runs[baselines[key]] = (cells, ())
            ran.written_of[name] = baselines[key]
            runs[name] = (with_swaps(cells, fault.plants), fault.plants)
        for name, lines in self._execute(runs).items():
            ran.lines[name] = lines
        return ran

    def _execute(self, runs: dict[str, tuple[list[str], tuple]]) -> dict:
        """Each run's lines: its rank cells on the ranks, then its kernel cells."""
        split = {}
        for name, (cells, plants) in runs.items():
            ranked = [MAGIC.sub("", c, count=1) for c in cells if MAGIC.match(c)]
            kernel = [c for c in cells if not MAGIC.match(c) or not self.ranks]
            pulls = sorted({n for c in kernel for n in PULL.findall(c)})
            split[name] = (ranked if self.ranks else [], plants, pulls, kernel)
        per_rank = []
        if self.ranks and any(cells for cells, _, _, _ in split.values()):
            programs = [
                (cells, plants, pulls) for cells, plants, pulls, _ in split.values()
            ]
            per_rank = spawn(
                _on_rank, self.ranks, self.prelude, programs, timeout=self.timeout
            )
        found = {}
        for i, (name, (_, plants, _, kernel)) in enumerate(split.items()):
            outputs = list(zip(*(rank[i][0] for rank in per_rank), strict=True))
            lines = [ln for cell in outputs for ln in folded(list(cell))]
            if kernel:
                namespace = {"__name__": "__main__"}
                namespace["ranks"] = Pulled([rank[i][1] for rank in per_rank])
                spreading = Plant(launch, "spawn", reaching(plants), True)
                with planted([*plants, spreading]), contextlib.chdir(BOOK):
                    exec(self.here, namespace)  # its imports see the plants too
                    lines += [ln for out in run_cells(kernel, namespace) for ln in out]
            found[name] = lines
        return found


def reaching(plants: Sequence[Plant | Swap]) -> Callable:
    """A plant for `launch.spawn`: a kernel cell's own ranks (`spawn(fn, n, ...)`)
    run `fn` under the fault's plants too, as the harness's ranks do."""
    mine = tuple(p for p in plants if isinstance(p, Plant))

    def wrap(real: Callable) -> Callable:
        def spawned(fn: Callable, n: int, *args: Any, **kwargs: Any) -> list:
            return real(_planted_call, n, mine, fn, *args, **kwargs)

        return spawned

    return wrap


def _planted_call(plants: tuple, fn: Callable, *args: Any, **kwargs: Any) -> Any:
    with planted(plants):
        return fn(*args, **kwargs)


def printed(cell: Any) -> list[str]:
    """The lines a stored code cell printed or displayed as text."""
    lines = []
    for out in cell.get("outputs", []):
        text = out.get("text") or out.get("data", {}).get("text/plain", "")
        lines += split_lines("".join(text))
    return lines


def folded(per_rank: list[list[str]]) -> list[str]:
    """One output's lines on each rank, as `%%ranks` shows them: "[all ranks] ..."
    where every rank printed the line, "[rank r] ..." where one did."""
    return repr(RankOutput(per_rank)).splitlines()


def _function_on_rank(fn: Callable, faults: list[tuple[str, tuple]], args: tuple):
    out = {}
    for name, plants in faults:
        with planted(plants):
            out[name] = captured(lambda: fn(*args))
    return out


def run_function(
    fn: Callable[..., object],
    faults: dict[str, Sequence[Plant]],
    *args: object,
    ranks: int = 0,
    timeout: float = 60.0,
) -> Ran:
    """`fn(*args)` as written and under each fault's plants: what it printed, folded
    across `ranks` spawned ranks as `%%ranks` shows it (0: in this process)."""
    todo = [(WRITTEN, ()), *((name, tuple(p)) for name, p in faults.items())]
    if ranks:
        per_rank = spawn(_function_on_rank, ranks, fn, todo, args, timeout=timeout)
        lines = {name: folded([r[name] for r in per_rank]) for name, _ in todo}
    else:
        lines = _function_on_rank(fn, todo, args)
    return Ran(lines, world=ranks)


def assert_holds(ran: Ran, fault: str, pattern: str) -> None:
    """Every line `pattern` matches under `fault` still passes (at least one): what a
    check cannot see, shown (a fault it is blind to, and why another check exists)."""
    hits = [ln for ln in ran.lines[fault] if re.search(pattern, positive(ln))]
    assert hits, f"under {fault!r}, no line matches {pattern!r}"
    assert not any(map(failing, hits)), "\n".join(hits)


class Flip:
    """A control that plants and checks, nothing more: `faults`, planted together
    (with `each=True`, each alone), must flip every verdict of `verdicts`, given in
    pairs: a regex on the stored notebook's line, then the planted fault in the
    words the book's checks page shows. `printed_on`: its verdicts print only on
    some machines ("2 GPUs")."""

    def __init__(
        self,
        faults: Sequence[str],
        *verdicts: str,
        each: bool = False,
        printed_on: str = "",
    ) -> None:
        if not verdicts or len(verdicts) % 2:
            raise ValueError(
                f"Flip{tuple(faults)}: give verdicts as (regex, fault) pairs"
            )
        self.faults, self.each, self.printed_on = list(faults), each, printed_on
        self.verdicts = list(zip(verdicts[::2], verdicts[1::2], strict=True))


class Controls:
    """A control file's table of `Flip`s for one chapter (a notebook's stem): each
    keyword names the test `tests()` makes of its Flip, so that pytest collects,
    selects and reports it under that name (`globals().update(CONTROLS.tests())`),
    and tests/verdict_controls.py reads the table from the source (literal strings
    only) for the book's checks page, as it reads a `pytest.mark.controls` marker.
    A control that checks more than its flips stays a function of its own, marked."""

    def __init__(self, stem: str, **flips: Flip) -> None:
        self.stem, self.flips = stem, flips

    def tests(self) -> dict[str, Callable[..., None]]:
        """The table's tests, by name, in its order."""
        return {name: self.test(name, flip) for name, flip in self.flips.items()}

    def test(self, name: str, flip: Flip) -> Callable[..., None]:
        """One Flip's test: `assert_flips` for each of its verdicts, under its
        faults planted together (or under each alone)."""
        plants = [[f] for f in flip.faults] if flip.each else [list(flip.faults)]

        def test(ran: Ran) -> None:
            for faults in plants:
                for pattern, _ in flip.verdicts:
                    assert_flips(ran, faults, pattern, flip.printed_on)

        test.__name__ = test.__qualname__ = name
        return test


def check_stored(
    node: pytest.Item,
    verdicts: Callable[[Any], str | list[str]],
    name: str,
    data: dict[str, Any],
    *plants: Plant,
) -> list[str]:
    """A chapter's verdicts judged on a run stored in book/measurements/ (`name`):
    `verdicts(stored)` prints them. For each `pytest.mark.controls` marker of the
    test `node`, every line it matches fails on the planted `data` (stored as a
    quiet run), or, with `plants`, passes on that data as written and fails with
    the plants set (a fault in the code that judges it); if the book stores a run,
    the lines pass on it as written, and fail on it marked as measured under load.
    The planted lines, for more checks."""
    from distcourse.bench import record

    def lines(stored: Any) -> list[str]:
        out = verdicts(stored)
        return [out] if isinstance(out, str) else list(out)

    quiet = record.Stored(name, data, {"quiet": True})
    written = lines(quiet) if plants else []
    with planted(plants):
        fault = lines(quiet)
    stored = record.load(name)
    markers = list(node.iter_markers("controls"))
    assert markers, f"{node.nodeid}: no pytest.mark.controls marker to check"
    for marker in markers:
        pattern = marker.args[1]

        def hits(found: list[str], pattern: str = pattern) -> list[str]:
            matched = [ln for ln in found if re.search(pattern, positive(ln))]
            assert matched, f"no line matches {pattern!r}:\n" + "\n".join(found)
            return matched

        assert all(map(failing, hits(fault))), "\n".join(fault)
        if plants:
            assert not any(map(failing, hits(written))), "\n".join(written)
        if stored is not None:  # as written: the run stored with the book
            assert not any(map(failing, hits(lines(stored)))), lines(stored)
            busy = record.Stored(name, stored.data, {"quiet": False})
            assert all(map(failing, hits(lines(busy)))), lines(busy)
    return fault
