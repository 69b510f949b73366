"""Notebook ranks on real ipyparallel engines: start, fail, stop, outlive nothing."""

from __future__ import annotations

import datetime
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from distcourse import runtime
from distcourse.launch import cluster, spawn, watchdog


def _processes(ranks: cluster.Ranks) -> list[int]:
    """Every process of a running set of ranks: controller, launcher, engines and
    whatever they started (the controller's heart monitor, say)."""
    return cluster.processes(ranks)


def _wait_gone(pids: list[int], within: float = 10.0) -> list[int]:
    end = time.monotonic() + within
    while time.monotonic() < end:
        alive = [p for p in pids if watchdog.pid_alive(p)]
        if not alive:
            return []
        time.sleep(0.1)
    return alive


@pytest.mark.parametrize("bad", [0, -2, 2.0, "4"])
def test_start_rejects_bad_rank_counts(bad: object) -> None:
    with pytest.raises(ValueError, match="positive integer"):
        cluster.start(bad)  # type: ignore[arg-type]


def test_start_rejects_a_bad_backend_before_starting_anything() -> None:
    with pytest.raises(ValueError, match="unknown backend"):
        cluster.start(2, backend="mpi")
    if not runtime.gpu_count():
        with pytest.raises(ValueError, match="NCCL needs one GPU per rank"):
            cluster.start(2, backend="nccl")


def test_default_ranks_follow_the_device_variable(monkeypatch) -> None:
    monkeypatch.setattr(runtime, "gpu_count", lambda: 8)  # a box with 8 GPUs
    monkeypatch.setenv(runtime.DEVICE_VARIABLE, "cpu")  # the test configuration
    assert cluster.default_ranks() == cluster.DEFAULT_RANKS
    monkeypatch.setenv(runtime.DEVICE_VARIABLE, "cuda")
    assert cluster.default_ranks() == 8
    monkeypatch.delenv(runtime.DEVICE_VARIABLE)
    assert cluster.default_ranks() == 8
    monkeypatch.setenv(runtime.DEVICE_VARIABLE, "emulated")
    assert cluster.default_ranks() == cluster.DEFAULT_RANKS


def test_ranks_start_on_emulated_gpus() -> None:
    with pytest.raises(ValueError, match="backend or device"):
        cluster.start(2, backend="gloo", device="emulated")
    ranks = cluster.start(2, device="emulated", activate=False)
    try:
        devices = ranks.run(_device_and_sum)
    finally:
        ranks.stop()
    assert devices == [("gpu:0", 1.0), ("gpu:1", 1.0)]


def _ranks_and_sum() -> tuple[int, int, float]:
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    return dist.get_rank(), dist.get_world_size(), t.item()


def _device_and_sum() -> tuple[str, float]:
    import torch
    import torch.distributed as dist

    from distcourse import runtime

    t = torch.tensor([float(dist.get_rank())], device=runtime.device())
    dist.all_reduce(t)
    return str(t.device), t.item()


def _fail_on_rank_one() -> None:
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise ValueError("rank one refuses")


def test_ranks_start_run_fail_stop_and_restart() -> None:
    ranks = cluster.start(2, activate=False)
    try:
        assert ranks.run(_ranks_and_sum) == [(0, 2, 1.0), (1, 2, 1.0)]
        assert ranks.pull("rank", rank=1) == 1
        # engines inherit the test configuration's device choice from the kernel
        device = ranks.run(os.environ.get, runtime.DEVICE_VARIABLE)
        assert device == [os.environ[runtime.DEVICE_VARIABLE]] * 2 == ["cpu"] * 2
        with pytest.raises(runtime.RankError, match="rank 1 failed: ValueError"):
            ranks.run(_fail_on_rank_one)
        with pytest.raises(ValueError, match="rank must be in 0..1"):
            ranks.pull("rank", rank=2)
        pids = _processes(ranks)
    finally:
        ranks.stop()
    assert _wait_gone(pids) == []
    again = cluster.start(3, activate=False)  # a second start in the same process
    try:
        assert [r for r, _, _ in again.run(_ranks_and_sum)] == [0, 1, 2]
        pids = _processes(again)
    finally:
        cluster.stop()
    assert _wait_gone(pids) == []


KERNEL = textwrap.dedent(
    """
    import json, os, sys, time
    from distcourse.launch import cluster
    ranks = cluster.start(2, activate=False)
    print(json.dumps(cluster.processes(ranks)), flush=True)
    time.sleep(3600)
    """
)


def test_engines_exit_when_the_kernel_is_killed() -> None:
    """SIGKILL runs no cleanup in the kernel: the watchdogs must end every process."""
    kernel = subprocess.Popen(
        [sys.executable, "-c", KERNEL], stdout=subprocess.PIPE, text=True
    )
    try:
        pids = json.loads(kernel.stdout.readline())
        assert len(pids) >= 4 and all(watchdog.pid_alive(p) for p in pids)
    finally:
        kernel.send_signal(signal.SIGKILL)
        kernel.wait()
    assert _wait_gone(pids) == []


def test_a_px_cell_that_raises_names_the_rank(tmp_path) -> None:
    """In a real kernel: the error of a %%px cell reaches the notebook with rank 1."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(
            "from distcourse.launch import cluster; r = cluster.start(2)"
        ),
        nbformat.v4.new_code_cell(
            "%%px\nif rank == 1:\n    raise ValueError(f'bad input on rank {rank}')"
        ),
        nbformat.v4.new_code_cell("r.stop()"),
    ]
    client = NotebookClient(nb, timeout=120, kernel_name="python3")
    with pytest.raises(CellExecutionError) as err:
        client.execute(cwd=str(tmp_path))
    # the failing cell returned its error promptly: no rank waits for the other. Its
    # own time (nbclient's record), not the kernel's and engines' start-up, which
    # took 63 s longer than alone once, with 3 test files running beside it
    timing = nb.cells[1].metadata.execution
    began, ended = timing["iopub.execute_input"], timing["shell.execute_reply"]
    took = (_when(ended) - _when(began)).total_seconds()
    assert took < 30, f"the failing %%px cell took {took:.1f} s"
    message = re.sub(r"\x1b\[[0-9;]*m", "", str(err.value))  # drop terminal colours
    assert "[1:execute]" in message
    assert "ValueError: bad input on rank 1" in message
    assert "[0:execute]" not in message


def _when(stamp: str) -> datetime.datetime:
    """A Jupyter message's time stamp, as nbclient records it ("...T...Z")."""
    return datetime.datetime.fromisoformat(stamp)


def _all_reduce_on_rank_zero_only(wait: float = 0.0) -> None:
    """The classic bug: rank 0 calls a collective that the other ranks skip. Rank 0's
    error carries what its process wrote meanwhile to file descriptor 2, where torch's
    C++ logger writes."""
    import os
    import tempfile

    import torch
    import torch.distributed as dist

    if dist.get_rank() != 0:
        time.sleep(wait)  # spawned ranks must outwait the timeout: exiting ends it
        return
    with tempfile.TemporaryFile() as log:
        saved = os.dup(2)
        os.dup2(log.fileno(), 2)
        try:
            dist.all_reduce(torch.ones(1))
        except RuntimeError as err:
            log.seek(0)
            raise RuntimeError(f"{err} | fd 2: {log.read().decode()!r}") from None
        finally:
            os.dup2(saved, 2)
            os.close(saved)


MISSING = "[Rank 0]: Ranks 1 failed to pass monitoredBarrier in 2000 ms"


def test_debug_ranks_name_the_rank_that_skipped_a_collective() -> None:
    """debug=True: the error names the missing rank, and torch's C++ logger, which
    prints it again with a timestamp, stays quiet (its lines reach a cell late)."""
    ranks = cluster.start(2, timeout=2, debug=True, activate=False)
    try:
        start = time.monotonic()
        with pytest.raises(runtime.RankError) as err:
            ranks.run(_all_reduce_on_rank_zero_only)
        assert time.monotonic() - start < 15
    finally:
        ranks.stop()
    assert str(err.value) == f"rank 0 failed: RuntimeError: {MISSING} | fd 2: ''"


def test_the_cpp_logger_prints_debug_errors_by_default() -> None:
    """The control for the test above: outside notebook ranks the logger does print."""
    with pytest.raises(runtime.RankError) as err:
        spawn(_all_reduce_on_rank_zero_only, 2, 3.0, debug=True, timeout=2)
    assert MISSING in str(err.value)
    assert "Rank 1 failed to pass monitoredBarrier" in str(err.value).split("fd 2:")[1]
