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
import sys
import tempfile

import pytest

# runtime.DEVICE_VARIABLE, spelt out: importing distcourse would import torch here
os.environ["DISTCOURSE_DEVICE"] = "cpu"


# ------------------------------------------------------------ longest files first -----
# pytest-xdist (`make unit`, `make notebooks`) hands out whole files in the order they
# were collected, the next one to whichever worker is free: a long file collected last
# runs alone at the end while the other workers idle. These, the longest (pytest's
# durations of a unit run on 2 cores and the stored notebooks' cell times,
# 2026-12-05), start first; every other file keeps its place after them.
FIRST = (
    "book/13_trainer.ipynb",
    "book/03b_ddp_in_practice.ipynb",
    "book/10_planner.ipynb",
    "book/02_collectives.ipynb",
    "book/11_debugging.ipynb",
    "book/08b_hybrid_global.ipynb",
    "book/05_pipeline.ipynb",
    "tests/test_book_verdicts.py",
    "tests/test_scripts_zero_fsdp.py",
    "tests/test_scripts_train_gpt.py",
    "tests/test_parallel_ddp_tutorial.py",
    "tests/test_launch_cluster.py",
    "tests/controls/test_03b_ddp_in_practice.py",
    "tests/test_project.py",
    "tests/controls/test_05_pipeline.py",
    "tests/controls/test_13_trainer.py",
    "tests/test_train_checkpoint.py",
    "tests/test_scripts_tp.py",
    "tests/test_scripts_ddp.py",
    "tests/test_launch_ranks.py",
    "tests/controls/test_08_hybrid.py",
    "tests/test_launch_script.py",
    "tests/controls/test_10_planner.py",
)


def pytest_collection_modifyitems(config, items):  # noqa: ANN001, ANN201 (pytest hook)
    """FIRST's files first, in FIRST's order (a stable sort: a file's own tests keep
    their order, and so do the files FIRST does not name)."""
    place = {name: i for i, name in enumerate(FIRST)}
    root = config.rootpath

    def key(item: pytest.Item) -> int:
        path = item.path
        name = path.relative_to(root).as_posix() if path.is_relative_to(root) else ""
        return place.get(name, len(FIRST))

    items.sort(key=key)


# ------------------------------------------------ nbval's kernels on Unix sockets -----
# jupyter_client starts a kernel on five TCP ports it found free by binding port 0 and
# closing the socket; the kernel binds them a second or more later, once it has
# started. Those ports come from the ephemeral range, where the gloo ranks of the
# test files running beside it bind their own listeners all the time: one taken in
# between kills the kernel ("ZMQError: Address already in use"), and its notebook's
# cells end as errors. Under an 8-rank gloo loop, 2 of 120 kernel starts died so; it
# failed tests/test_book_verdicts.py inside `make test`. ZeroMQ's ipc transport
# binds a socket file that no other process names: nothing can take it.
@pytest.fixture(autouse=True)
def drained_device_work() -> None:
    """Each test starts with no emulated device work pending. A test that ran device
    ops in this process and left them unsynchronized (fine on a GPU: they complete)
    would otherwise make a later test's host clock read fail the timing rule
    (emulate.timing), in whichever test file its pytest-xdist worker runs next."""
    timing = sys.modules.get("distcourse.emulate.timing")
    if timing is not None:
        timing.host_synced("between tests")


def pytest_configure(config):  # noqa: ANN001, ANN201 (pytest hook)
    if os.name != "posix" or not config.pluginmanager.hasplugin("nbval"):
        return
    import uuid

    import nbval.kernel
    from jupyter_client.manager import KernelManager
    from traitlets import default

    class UnixSocketKernel(KernelManager):
        """A kernel manager whose kernel talks over Unix socket files of its own."""

        @default("transport")
        def _transport_default(self) -> str:
            return "ipc"

        @default("ip")
        def _ip_default(self) -> str:  # the files' prefix: unique per kernel
            return os.path.join(tempfile.gettempdir(), f"nbval-{uuid.uuid4().hex}")

    nbval.kernel.KernelManager = UnixSocketKernel


# ------------------------------------------------------ verdicts of the notebooks -----
# nbval compares what each cell printed with the stored output, except what
# book/nbval.cfg masks. On top of that, every verdict a chapter printed in this run
# ("...: PASS", "...: True") must hold: the same check `make test-gpu` makes on GPU
# ranks (distcourse.launch.bookrun), here on the outputs nbval has just executed, so
# the notebooks are not executed a second time for it.
#
# A notebook's verdicts are checked where it ran, after its last cell: a failed one
# fails that cell's teardown, naming the verdict. The count travels in the report's
# user_properties, so the summary line adds up under pytest-xdist too (`make
# notebooks` runs two notebooks at a time, each on one worker).

_KEY = "notebook verdicts"
_executed: dict[str, list] = {}  # notebook path -> the outputs of its executed cells
_last: dict[str, str] = {}  # notebook path -> the node id of its last collected cell
_tally: list[tuple[int, list[str]]] = []  # (verdicts held, failed ones) per notebook


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):  # noqa: ANN001, ANN201 (pytest hook)
    report = yield
    path = str(item.fspath)
    outputs = getattr(item, "test_outputs", None)  # an nbval cell, once it has run
    if call.when == "call" and outputs is not None:
        _executed.setdefault(path, []).append(outputs)
    if call.when != "teardown" or path not in _executed:
        return report
    if item.nodeid != _last_cell(item.session, path):
        return report
    passed, failed = _verdicts(path, _executed.pop(path))
    report.user_properties.append((_KEY, (passed, failed)))
    if failed and report.passed:
        report.outcome = "failed"
        report.longrepr = "verdicts that did not hold:\n" + "\n".join(failed)
    return report


def _last_cell(session: pytest.Session, path: str) -> str:
    """The node id of the last cell of notebook `path` that this session runs."""
    if not _last:
        for item in session.items:
            _last[str(item.fspath)] = item.nodeid
    return _last[path]


def pytest_runtest_logreport(report):  # noqa: ANN001, ANN201 (pytest hook)
    for key, value in report.user_properties:
        if key == _KEY:
            passed, failed = value
            _tally.append((passed, list(failed)))


def pytest_sessionfinish(session, exitstatus):  # noqa: ANN001, ANN201 (pytest hook)
    if hasattr(session.config, "workerinput") or not _tally:
        return  # an xdist worker: the controller reports, from the reports it got
    failed = [line for _, lines in _tally for line in lines]
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    for line in failed:
        reporter.write_line(f"verdict FAILED: {line}", red=True)
    reporter.write_line(
        f"notebook verdicts: {sum(passed for passed, _ in _tally)} passed, "
        f"{len(failed)} failed ({len(_tally)} notebooks)"
    )
    if failed and session.exitstatus == 0:
        session.exitstatus = 1


def _verdicts(path: str, cells: list) -> tuple[int, list[str]]:
    """How many verdicts in the executed `cells` of notebook `path` held, and each
    failed one with the notebook's name."""
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    from distcourse.launch import bookrun

    executed = new_notebook(cells=[new_code_cell(outputs=o) for o in cells])
    stored = nbformat.read(path, as_version=4)
    passed, bad = bookrun.verdicts(executed, bookrun.expected_negatives(stored))
    name = os.path.basename(path)
    failed = [f"{name}: {line}" for line in bad]
    if not passed and bookrun.verdicts(stored)[0]:
        failed.append(f"{name}: printed no verdict this time")
    return len(passed), failed
