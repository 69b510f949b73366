"""conftest.py's verdict check: under `pytest --nbval`, every verdict a notebook prints
in this run must hold, also where nbval does not compare the output.

Each case runs pytest on small notebooks in a folder of the repository (so the
repository's conftest.py applies), in a subprocess with its own kernel; the three
cases that must pass share one run (`passing`).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output

pytest.importorskip("nbval")  # a GPU box may run the unit tests without it

ROOT = Path(__file__).resolve().parents[1]


def _write(path: Path, printed: str, stored: str) -> Path:
    """A notebook that prints `printed` where `stored` is stored.

    The cell is marked NBVAL_IGNORE_OUTPUT, as a timing cell would be: nbval itself
    does not compare it, so only the verdict check can see what it printed.
    """
    cell = new_code_cell(
        f"# NBVAL_IGNORE_OUTPUT\nprint({printed!r})",
        execution_count=2,
        outputs=[new_output("stream", name="stdout", text=stored + "\n")],
    )
    nbformat.write(
        new_notebook(cells=[new_code_cell("x = 1", execution_count=1), cell]), path
    )
    return path


def _run_nbval(
    folder: Path, printed: str, stored: str, *more: Path, workers: int = 0
) -> subprocess.CompletedProcess:
    """pytest --nbval on verdicts.ipynb (`_write`) and the notebooks `more`, on
    `workers` pytest-xdist workers (0: in pytest's own process)."""
    return _pytest(
        _write(folder / "verdicts.ipynb", printed, stored), *more, workers=workers
    )


def _pytest(*notebooks: Path, workers: int = 0) -> subprocess.CompletedProcess:
    """pytest --nbval (lax) on `notebooks`, from the repository's root."""
    command = [sys.executable, "-m", "pytest", *map(str, notebooks)]
    command += ["--nbval-lax", "-q", "--nbval-current-env", "-p", "no:cacheprovider"]
    if workers:
        command += ["-n", str(workers), "--dist", "loadfile"]
    return subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def _folder() -> Iterator[Path]:
    """A new folder inside the repository (conftest.py applies), removed after."""
    (ROOT / "_build").mkdir(exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="verdicts-", dir=ROOT / "_build"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


folder = pytest.fixture(_folder)


@pytest.fixture(scope="module")
def passing() -> Iterator[tuple[subprocess.CompletedProcess, list[str]]]:
    """One pytest run of three notebooks that must all pass (each a pytest process
    and a kernel: seconds of CPU apiece); the run, and its lines that name a
    failure or an error."""
    folder = next(made := _folder())
    holds = _write(folder / "holds.ipynb", "same on every rank: True", "same: True")
    shown = "one bucket hides nothing: False"  # a check shown failing on purpose
    on_purpose = _write(folder / "on_purpose.ipynb", shown, shown)
    cell = new_code_cell(
        "from ipykernel.kernelapp import IPKernelApp\n"
        "assert IPKernelApp.instance().transport == 'ipc'"
    )
    nbformat.write(new_notebook(cells=[cell]), transport := folder / "transport.ipynb")
    run = _pytest(holds, on_purpose, transport)
    yield run, [ln for ln in run.stdout.splitlines() if "FAIL" in ln or "ERROR" in ln]
    next(made, None)


def test_a_verdict_that_fails_where_nbval_does_not_compare_fails_the_run(
    folder: Path,
) -> None:
    run = _run_nbval(folder, "max |diff| <= 1e-06: FAIL", "max |diff| <= 1e-06: PASS")
    assert run.returncode == 1, run.stdout
    assert "verdict FAILED: verdicts.ipynb: max |diff| <= 1e-06: FAIL" in run.stdout
    assert "verdicts.ipynb: printed no verdict this time" in run.stdout
    assert "notebook verdicts: 0 passed, 2 failed (1 notebooks)" in run.stdout


def test_verdicts_that_hold_pass_and_are_counted(passing: tuple) -> None:
    run, failures = passing
    assert run.returncode == 0 and not failures, run.stdout
    assert "notebook verdicts: 2 passed, 0 failed (3 notebooks)" in run.stdout


def test_a_fail_printed_on_purpose_in_the_stored_notebook_passes(
    passing: tuple,
) -> None:
    run, failures = passing
    assert not [line for line in failures if "on_purpose.ipynb" in line], run.stdout
    assert "\n5 passed in " in run.stdout  # every cell of the 3 notebooks ran


def test_verdicts_are_checked_and_counted_on_xdist_workers(folder: Path) -> None:
    """`make notebooks` runs notebooks side by side: each worker checks its own
    notebook's verdicts, and the summary adds up the workers' counts."""
    good = _write(folder / "good.ipynb", "same on every rank: True", "same: True")
    run = _run_nbval(
        folder, "diff <= 1e-06: FAIL", "diff <= 1e-06: PASS", good, workers=2
    )
    assert run.returncode == 1, run.stdout
    assert "verdict FAILED: verdicts.ipynb: diff <= 1e-06: FAIL" in run.stdout, (
        run.stdout
    )
    assert "notebook verdicts: 1 passed, 2 failed (2 notebooks)" in run.stdout, (
        run.stdout
    )


def test_nbvals_kernels_talk_over_unix_sockets(passing: tuple) -> None:
    """conftest.py starts nbval's kernels on ipc sockets: a TCP port that
    jupyter_client found free could be taken by a gloo rank before the kernel bound
    it (the kernel died, and this file's xdist test failed inside `make test`)."""
    run, failures = passing
    assert not [line for line in failures if "transport.ipynb" in line], run.stdout
    assert "\n5 passed in " in run.stdout
