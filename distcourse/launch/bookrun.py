"""`make test-gpu`: re-execute every chapter on NCCL ranks and check its verdicts.

    python -m distcourse.launch.bookrun [book/*.ipynb ...] [--out DIR] [--timeout S]

The stored outputs are CPU outputs, so on a GPU box they cannot be compared digit for
digit: timings, device names and the last bits of a loss legitimately differ. What
must not differ is what the chapters claim. A run passes when no cell raises (cells
tagged `raises-exception` may) and every verdict a chapter prints is a PASS: the lines
of `checks.verdict` ("... <= 1e-06: PASS") and the claims printed as "...: True".
A FAIL or False that the stored notebook prints word for word is a check shown failing
on purpose (chapter 3: one bucket hides nothing) and must come out the same.
A line ending in PASS is not enough: each must be one the tests know, matched by a
negative control of its chapter (a `pytest.mark.controls` marker or a row of a
`harness.Controls` table, read by tests/verdict_controls.py), and each control's
verdict must be printed (unless it prints only on some machines). A verdict that
changed its words, or a check that stopped printing, fails the run. Everything else
in the output is not compared.

DISTCOURSE_DEVICE chooses the ranks (default cuda). A chapter runs at the rank count
it is written for, never cut to fewer: on NCCL every rank needs a GPU of its own, so a
chapter that needs more GPUs than the box has is reported `needs N GPUs: not run` and
does not fail the run. What a chapter needs is the `min_ranks` of its notebook
metadata (`{"distcourse": {"min_ranks": 1}}`: its cells run on any count from there,
e.g. `cluster.start(min(4, cluster.default_ranks()))`), or else the largest rank count
its code cells write (`cluster.start(4)`, `spawn(fn, 2)`, `--nproc-per-node 4`).
DISTCOURSE_DEVICE=cpu is the dry run: every chapter on gloo ranks at its written
counts, so CI exercises everything here except the NCCL path itself.
DISTCOURSE_DEVICE=emulated runs every chapter at its written count on emulated GPUs
(`distcourse.emulate`: a device per rank under CUDA's and NCCL's rules, data in host
memory): an emulated box has as many GPUs as a chapter needs, and the report says
the machine was emulated. `make test-gpu` picks it on a machine without a GPU.
Notebooks execute from a copy in memory, with book/ as working directory; the stored
notebooks are never written. The executed copies and the report go to --out.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from distcourse import runtime, tables
from distcourse.arguments import positive_int

EMULATED = "emulated"  # runtime.EMULATED: the DISTCOURSE_DEVICE value
BOOK = Path(__file__).resolve().parents[2] / "book"
DEFAULT_OUT = Path("_build/bookrun")
TESTS = BOOK.parent / "tests"  # where the negative controls are marked
VERDICT = re.compile(r"(?<![\w])(PASS|FAIL)\s*$")  # checks.verdict's last word
CLAIM = re.compile(r":\s*(True|False)\s*$")  # "identical on every rank: True"
# The rank counts a code cell writes: cluster.start(4), spawn(fn, 2), --nproc-per-node 4
RANK_COUNT = re.compile(
    r"cluster\.start\(\s*(\d+)"
    r"|\bspawn\(\s*[\w.]+\s*,\s*(\d+)"
    r"|nproc[-_]per[-_]node\W{1,3}(\d+)"
)


@dataclass
class Chapter:
    """One notebook's plan and result."""

    path: Path
    needs: int  # the fewest ranks (GPUs, on NCCL) it is written for; 0: none
    runs: bool  # False: it needs more GPUs than this box has, and is not run
    seconds: float = 0.0
    passed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def name(self) -> str:
        return self.path.stem

    @property
    def ok(self) -> bool:
        return self.error is None and not self.failed

    @property
    def result(self) -> str:
        if not self.runs:
            return f"needs {self.needs} GPUs: not run"
        return "ok" if self.ok else "FAILED"


def _lines(nb: nbformat.NotebookNode) -> list[str]:
    """Every line of text that the code cells of `nb` printed or displayed."""
    found = []
    for cell in nb.cells:
        for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
            text = out.get("text", "")
            text = text or out.get("data", {}).get("text/plain", "")
            found += "".join(text).splitlines()
    return found


def verdicts(
    nb: nbformat.NotebookNode, expected: frozenset[str] = frozenset()
) -> tuple[list[str], list[str]]:
    """(passed, failed): the verdict and claim lines of an executed notebook.

    A FAIL or False line passes only when it is in `expected`: the negative lines of
    the stored notebook, printed on purpose (a check shown failing where it must).
    """
    passed, failed = [], []
    for line in _lines(nb):
        match = VERDICT.search(line) or CLAIM.search(line)
        if match:
            good = match[1] in ("PASS", "True") or line.strip() in expected
            (passed if good else failed).append(line.strip())
    return passed, failed


def controls(tests: Path = TESTS) -> list:
    """The negative controls marked in the test files under `tests`, read by the
    repository's tests/verdict_controls.py (an AST walk; nothing is run)."""
    module = sys.modules.get("verdict_controls")  # the tests imported it already
    if module is None:
        reader = TESTS / "verdict_controls.py"
        if not reader.is_file():
            raise FileNotFoundError(f"no {reader}: the book runs from a clone")
        spec = importlib.util.spec_from_file_location("verdict_controls", reader)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclasses look their module up
        spec.loader.exec_module(module)
    return module.find_controls(tests)


def unknown(name: str, passed: list[str], known: list) -> list[str]:
    """What the controls do not account for in a chapter's passed verdicts: a PASS
    or True line no control of chapter `name` matches, and a control whose verdict
    no line is (leaving out those printed only on some machines, `printed_on`). A
    FAIL or False line in `passed` is a negative printed on purpose, matched word
    for word with the stored notebook already."""
    mine = [c for c in known if c.notebook == name]
    positive = [line for line in passed if _positive(line)]
    found = [
        f"no control knows this verdict: {line}"
        for line in positive
        if not any(c.matches(line) for c in mine)
    ]
    found += [
        f"not printed: the verdict of {c.where} ({c.pattern})"
        for c in mine
        if not c.printed_on and not any(c.matches(line) for line in positive)
    ]
    return found


def _positive(line: str) -> bool:
    match = VERDICT.search(line) or CLAIM.search(line)
    return match is not None and match[1] in ("PASS", "True")


def expected_negatives(nb: nbformat.NotebookNode) -> frozenset[str]:
    """The FAIL / False lines a stored notebook prints on purpose, word for word."""
    _, negative = verdicts(nb)
    return frozenset(negative)


def written_ranks(nb: nbformat.NotebookNode) -> int:
    """The most ranks any code cell of the notebook writes as a number (0: none)."""
    counts = [
        int(next(n for n in m.groups() if n))
        for cell in nb.cells
        if cell.cell_type == "code"
        for m in RANK_COUNT.finditer(cell.source)
    ]
    return max(counts, default=0)


def needed_ranks(nb: nbformat.NotebookNode, name: str = "notebook") -> int:
    """The fewest ranks the chapter is written for: its metadata's `min_ranks`, or
    else the most ranks a code cell writes. A `min_ranks` below a count written in a
    cell would run that cell short: refused, naming the chapter."""
    declared = nb.metadata.get("distcourse", {}).get("min_ranks")
    written = written_ranks(nb)
    if declared is None:
        return written
    positive_int(declared, f"{name}: min_ranks")
    if declared < written:
        raise ValueError(
            f"{name}: metadata says min_ranks={declared}, but a cell starts "
            f"{written} ranks; write that count as min(...) of the ranks at hand"
        )
    return declared


def plan(paths: list[Path], device: str, gpus: int) -> list[Chapter]:
    """Which chapters run: all on the CPU (gloo) and on emulated GPUs (as many as a
    chapter needs), those that fit the GPUs on cuda."""
    every = device in ("cpu", EMULATED)
    chapters = []
    for path in paths:
        needs = needed_ranks(nbformat.read(path, as_version=4), path.stem)
        chapters.append(Chapter(path, needs, every or needs <= gpus))
    return chapters


def execute(
    chapter: Chapter, out: Path, timeout: float, known: list
) -> nbformat.NotebookNode:
    """Run the chapter in a fresh kernel, in its own folder; record time and verdicts,
    each passed one checked against the negative controls `known`.

    The executed copy is written to `out`, never over the stored notebook.
    """
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(chapter.path, as_version=4)
    expected = expected_negatives(nb)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3")
    start = time.perf_counter()
    try:
        client.execute(cwd=str(chapter.path.parent))
    except CellExecutionError as err:
        chapter.error = _first_line_of_error(str(err))
    except Exception as err:  # a kernel that died or timed out: report, go on
        chapter.error = f"{type(err).__name__}: {err}".splitlines()[0]
    chapter.seconds = time.perf_counter() - start
    chapter.passed, chapter.failed = verdicts(nb, expected)
    if chapter.error is None:  # a chapter stopped by an error prints only some
        chapter.failed += unknown(chapter.name, chapter.passed, known)
    out.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, out / chapter.path.name)
    return nb


def _first_line_of_error(message: str) -> str:
    plain = re.sub(r"\x1b\[[0-9;]*m", "", message)  # drop terminal colours
    lines = [ln for ln in plain.splitlines() if re.match(r"\w*(Error|Exception)", ln)]
    return lines[-1] if lines else plain.strip().splitlines()[-1]


def machine(device: str, gpus: int) -> str:
    """What ran the chapters: the GPU model and count, the emulated box, or the CPU
    dry run."""
    if device == "cpu":
        return "CPU dry run (DISTCOURSE_DEVICE=cpu: gloo ranks, written rank counts)"
    if device == EMULATED:
        return (
            "an emulated GPU box (DISTCOURSE_DEVICE=emulated: one emulated GPU per "
            "rank, NCCL's rules, written rank counts; no real GPU ran)"
        )
    import torch

    return f"{gpus} x {torch.cuda.get_device_name(0)} (NCCL ranks, one per GPU)"


def report(chapters: list[Chapter], where: str) -> str:
    """The short report: each chapter run or not, its verdicts and time; the machine."""
    rows = [("chapter", "needs", "time", "passed", "failed", "result")]
    for c in chapters:
        ran = (f"{c.seconds:.1f}s", len(c.passed), len(c.failed))
        rows.append((c.name, c.needs, *(ran if c.runs else ("-", "-", "-")), c.result))
    lines = [
        f"Book run on {where}",
        "needs: the fewest ranks a chapter is written for (on NCCL, a GPU each)",
        "",
        tables.aligned(rows, (24, 5, 8, 6, 6, 0), "<>>>>", gaps=(1, 1, 1, 1, 2)),
    ]
    for c in chapters:
        lines += [f"{c.name}: cell error: {c.error}"] if c.error else []
        lines += [f"{c.name}: {line}" for line in c.failed]
    ran = [c for c in chapters if c.runs]
    passed = sum(len(c.passed) for c in ran)
    failed = sum(len(c.failed) for c in ran)
    skipped = len(chapters) - len(ran)
    counts = f"chapters: {len(ran)} run, {skipped} not run (need more GPUs)"
    verdict = "PASS" if succeeded(chapters) else "FAIL"
    lines += ["", counts, f"verdicts: {passed} passed, {failed} failed; {verdict}"]
    return "\n".join(lines)


def succeeded(chapters: list[Chapter]) -> bool:
    """Every chapter that ran is ok, and they printed at least one verdict.

    A chapter not run (it needs more GPUs than the box has) fails nothing; but a run
    in which nothing ran, or nothing was checked, is no pass.
    """
    ran = [c for c in chapters if c.runs]
    return all(c.ok for c in ran) and any(c.passed for c in ran)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m distcourse.launch.bookrun")
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: book/*")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--timeout", type=float, default=300, help="seconds a cell")
    parser.add_argument(
        "--controls", type=Path, default=TESTS, help="folder of the marked controls"
    )
    args = parser.parse_args(argv)
    device = runtime.device_preference() or "cuda"
    os.environ[runtime.DEVICE_VARIABLE] = device  # kernels and engines inherit it
    gpus = runtime.gpu_count()
    if device not in ("cpu", runtime.EMULATED) and not gpus:  # cuda, and no GPU
        print(
            "DISTCOURSE_DEVICE=cuda needs a GPU and none is visible here. The same "
            "run on emulated GPUs: DISTCOURSE_DEVICE=emulated make test-gpu (what "
            "make test-gpu picks without a GPU); its dry run on CPU ranks: "
            "DISTCOURSE_DEVICE=cpu make test-gpu",
            file=sys.stderr,
        )
        return 2
    chapters = plan(args.notebooks or sorted(BOOK.glob("*.ipynb")), device, gpus)
    known = controls(args.controls)
    for c in chapters:
        if not c.runs:
            print(f"{c.name} needs {c.needs} GPUs, this box has {gpus}: not run")
            continue
        print(f"running {c.name} on {device} ranks ...", flush=True)
        execute(c, args.out, args.timeout, known)
    text = report(chapters, machine(device, gpus))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.txt").write_text(text + "\n")
    print(text + f"\n(report and executed notebooks in {args.out})")
    return 0 if succeeded(chapters) else 1


if __name__ == "__main__":
    sys.exit(main())
