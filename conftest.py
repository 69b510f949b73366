"""The test configuration: every pytest run here (tests/, book/, a bare `pytest
--nbval book/`) puts its ranks on gloo and the CPU, even on a GPU box.

The notebooks' stored outputs were made on CPU ranks (`backend=gloo, device=cpu`, CPU
arithmetic, the written rank counts), so only CPU ranks can reproduce them; the unit
tests' tensors live on the CPU too. The variable is set here, before any kernel,
engine or rank starts, and every child process inherits it (runtime.pick_backend and
cluster.default_ranks read it). A GPU run of the book is `make test-gpu`.
"""

from __future__ import annotations

import os

# runtime.DEVICE_VARIABLE, spelt out: importing distcourse would import torch here
os.environ["DISTCOURSE_DEVICE"] = "cpu"


# ------------------------------------------------------ verdicts of the notebooks -----
# nbval compares what each cell printed with the stored output, except what
# book/nbval.cfg masks. On top of that, every verdict a chapter printed in this run
# ("...: PASS", "...: True") must hold: the same check `make test-gpu` makes on GPU
# ranks (distcourse.launch.bookrun), here on the outputs nbval has just executed, so
# the notebooks are not executed a second time for it.

_executed: dict[str, list] = {}  # notebook path -> the outputs of its executed cells


def pytest_runtest_makereport(item, call):  # noqa: ANN001, ANN201 (pytest hook)
    outputs = getattr(item, "test_outputs", None)  # an nbval cell, once it has run
    if call.when == "call" and outputs is not None:
        _executed.setdefault(str(item.fspath), []).append(outputs)


def pytest_sessionfinish(session, exitstatus):  # noqa: ANN001, ANN201 (pytest hook)
    if not _executed:
        return
    passed, failed = _verdicts()
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    for line in failed:
        reporter.write_line(f"verdict FAILED: {line}", red=True)
    reporter.write_line(
        f"notebook verdicts: {passed} passed, {len(failed)} failed "
        f"({len(_executed)} notebooks)"
    )
    if failed and session.exitstatus == 0:
        session.exitstatus = 1


def _verdicts() -> tuple[int, list[str]]:
    """How many verdicts held, and each failed one with its notebook's name."""
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    from distcourse.launch import bookrun

    count, failed = 0, []
    for path, cells in sorted(_executed.items()):
        executed = new_notebook(cells=[new_code_cell(outputs=o) for o in cells])
        stored = nbformat.read(path, as_version=4)
        passed, bad = bookrun.verdicts(executed, bookrun.expected_negatives(stored))
        count += len(passed)
        failed += [f"{os.path.basename(path)}: {line}" for line in bad]
        if not passed and bookrun.verdicts(stored)[0]:
            failed.append(f"{os.path.basename(path)}: printed no verdict this time")
    return count, failed
