"""`make test-gpu`: re-execute every chapter on NCCL ranks and check its verdicts.

    python -m distcourse.launch.bookrun [book/*.ipynb ...] [--out DIR] [--timeout S]

The stored outputs are CPU outputs, so on a GPU box they cannot be compared digit for
digit: timings, device names and the last bits of a loss legitimately differ. What
must not differ is what the chapters claim. A run passes when no cell raises (cells
tagged `raises-exception` may) and every verdict a chapter prints is a PASS: the lines
of `checks.verdict` ("... <= 1e-06: PASS") and the claims printed as "...: True".
A FAIL or False that the stored notebook prints word for word is a check shown failing
on purpose (chapter 3: one bucket hides nothing) and must come out the same.
Everything else in the output is not compared.

DISTCOURSE_DEVICE chooses the ranks (default cuda): each chapter runs on its written
rank count where there are that many GPUs, otherwise on one rank per GPU, and the
report names those chapters. DISTCOURSE_DEVICE=cpu is the dry run: gloo ranks at the
written counts, so CI exercises everything here except the NCCL path itself.
Notebooks execute from a copy in memory, with book/ as working directory; the stored
notebooks are never written. The executed copies and the report go to --out.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from distcourse import runtime

BOOK = Path(__file__).resolve().parents[2] / "book"
DEFAULT_OUT = Path("_build/bookrun")
VERDICT = re.compile(r"(?<![\w])(PASS|FAIL)\s*$")  # checks.verdict's last word
CLAIM = re.compile(r":\s*(True|False)\s*$")  # "identical on every rank: True"
START = re.compile(r"(cluster\.start\(\s*)(\d+)")  # cluster.start(4 ... )


@dataclass
class Chapter:
    """One notebook's plan and result."""

    path: Path
    written_ranks: int  # the largest cluster.start(N) in the notebook (0: none)
    ranks: int  # the count it runs on here
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


def expected_negatives(nb: nbformat.NotebookNode) -> frozenset[str]:
    """The FAIL / False lines a stored notebook prints on purpose, word for word."""
    _, negative = verdicts(nb)
    return frozenset(negative)


def written_ranks(nb: nbformat.NotebookNode) -> int:
    """The most ranks any `cluster.start(N)` of the notebook asks for (0: none)."""
    counts = [
        int(m[2])
        for cell in nb.cells
        if cell.cell_type == "code"
        for m in START.finditer(cell.source)
    ]
    return max(counts, default=0)


def set_ranks(nb: nbformat.NotebookNode, most: int) -> None:
    """Cap every `cluster.start(N)` of the (copied) notebook at `most` ranks."""
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.source = START.sub(
                lambda m: f"{m[1]}{min(int(m[2]), most)}", cell.source
            )


def plan(paths: list[Path], device: str, gpus: int) -> list[Chapter]:
    """The rank count of each chapter: as written, or one per GPU where short."""
    chapters = []
    for path in paths:
        n = written_ranks(nbformat.read(path, as_version=4))
        ranks = min(n, gpus) if device == "cuda" else n
        chapters.append(Chapter(path, n, ranks))
    return chapters


def execute(chapter: Chapter, out: Path, timeout: float) -> nbformat.NotebookNode:
    """Run the chapter in a fresh kernel, in its own folder; record time and verdicts.

    The executed copy is written to `out`, never over the stored notebook.
    """
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(chapter.path, as_version=4)
    expected = expected_negatives(nb)
    if chapter.ranks != chapter.written_ranks:
        set_ranks(nb, chapter.ranks)
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
    out.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, out / chapter.path.name)
    return nb


def _first_line_of_error(message: str) -> str:
    plain = re.sub(r"\x1b\[[0-9;]*m", "", message)  # drop terminal colours
    lines = [ln for ln in plain.splitlines() if re.match(r"\w*(Error|Exception)", ln)]
    return lines[-1] if lines else plain.strip().splitlines()[-1]


def machine(device: str, gpus: int) -> str:
    """What ran the chapters: the GPU model and count, or the CPU dry run."""
    if device == "cpu":
        return "CPU dry run (DISTCOURSE_DEVICE=cpu: gloo ranks, written rank counts)"
    import torch

    return f"{gpus} x {torch.cuda.get_device_name(0)} (NCCL ranks, one per GPU)"


def report(chapters: list[Chapter], where: str) -> str:
    """The short report: chapters run, verdicts, time per chapter, the machine."""
    lines = [f"Book run on {where}", ""]
    head = f"{'chapter':<24} {'ranks':>5} {'time':>8} {'passed':>6} {'failed':>6}"
    lines.append(f"{head}  result")
    for c in chapters:
        ranks = f"{c.ranks}" + ("*" if c.ranks != c.written_ranks else "")
        lines.append(
            f"{c.name:<24} {ranks:>5} {c.seconds:>7.1f}s {len(c.passed):>6} "
            f"{len(c.failed):>6}  {'ok' if c.ok else 'FAILED'}"
        )
    short = [c for c in chapters if c.ranks != c.written_ranks]
    if short:
        names = ", ".join(f"{c.name} ({c.written_ranks})" for c in short)
        lines += ["", f"* more ranks than GPUs, run one per GPU: {names}"]
    for c in chapters:
        lines += [f"{c.name}: cell error: {c.error}"] if c.error else []
        lines += [f"{c.name}: {line}" for line in c.failed]
    passed, failed = (sum(len(c.passed) for c in chapters),
                      sum(len(c.failed) for c in chapters))  # fmt: skip
    verdict = "PASS" if succeeded(chapters) else "FAIL"
    lines += ["", f"verdicts: {passed} passed, {failed} failed; {verdict}"]
    return "\n".join(lines)


def succeeded(chapters: list[Chapter]) -> bool:
    """No cell error, no failed verdict, and at least one verdict seen at all."""
    return all(c.ok for c in chapters) and any(c.passed for c in chapters)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m distcourse.launch.bookrun")
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: book/*")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--timeout", type=float, default=300, help="seconds a cell")
    args = parser.parse_args(argv)
    device = runtime.device_preference() or "cuda"
    os.environ[runtime.DEVICE_VARIABLE] = device  # kernels and engines inherit it
    gpus = runtime.gpu_count()
    if device == "cuda" and not gpus:
        print(
            "make test-gpu needs a GPU and none is visible here. Its dry run on CPU "
            "ranks: DISTCOURSE_DEVICE=cpu make test-gpu",
            file=sys.stderr,
        )
        return 2
    chapters = plan(args.notebooks or sorted(BOOK.glob("*.ipynb")), device, gpus)
    for c in chapters:
        if c.ranks != c.written_ranks:
            print(f"{c.name} needs {c.written_ranks} GPUs, this box has {gpus}: "
                  f"running it on {c.ranks}, one rank per GPU", flush=True)  # fmt: skip
    for c in chapters:
        print(f"running {c.name} on {c.ranks} {device} ranks ...", flush=True)
        execute(c, args.out, args.timeout)
    text = report(chapters, machine(device, gpus))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.txt").write_text(text + "\n")
    print(text + f"\n(report and executed notebooks in {args.out})")
    return 0 if succeeded(chapters) else 1


if __name__ == "__main__":
    sys.exit(main())
