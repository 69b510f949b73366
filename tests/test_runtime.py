"""distcourse.runtime on real gloo ranks: groups, seeds, spawn, its failure modes."""

from __future__ import annotations

import contextlib
import io
import os
import socket
import time

import psutil
import pytest
import torch
import torch.distributed as dist

from distcourse import runtime
from distcourse.launch import spawn, watchdog
from distcourse.runtime import RankError


def _rank_sum() -> tuple[int, int, str, float]:
    info = runtime.require_initialized()
    t = torch.tensor([float(info.rank)])
    dist.all_reduce(t)
    return info.rank, info.world_size, info.backend, t.item()


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_spawn_runs_a_collective_on_every_rank(world_size: int) -> None:
    results = spawn(_rank_sum, world_size)
    total = float(sum(range(world_size)))
    assert results == [(r, world_size, "gloo", total) for r in range(world_size)]


def test_spawn_accepts_lambdas_and_arguments() -> None:
    assert spawn(lambda a, b=0: a + b + dist.get_rank(), 2, 10, b=5) == [15, 16]


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", None])
def test_spawn_rejects_bad_world_size(bad: object) -> None:
    with pytest.raises(ValueError, match="world_size must be a positive integer"):
        spawn(_rank_sum, bad)  # type: ignore[arg-type]


def test_spawn_rejects_bad_timeout() -> None:
    with pytest.raises(ValueError, match="timeout"):
        spawn(_rank_sum, 2, timeout=0)


def _write_pid_then(path: str, action: str) -> None:
    with open(f"{path}.{dist.get_rank()}", "w") as f:
        f.write(str(os.getpid()))
    dist.barrier()  # every rank has written its pid
    if dist.get_rank() == 1:
        if action == "raise":
            raise ValueError("rank one is unhappy")
        if action == "exit":
            os._exit(7)
        if action == "hang":
            time.sleep(3600)
    dist.barrier()  # the other ranks wait for rank 1 here


def _assert_gone(path: str, world_size: int, within: float = 5.0) -> None:
    pids = [int(open(f"{path}.{r}").read()) for r in range(world_size)]
    end = time.monotonic() + within
    while any(watchdog.pid_alive(p) for p in pids) and time.monotonic() < end:
        time.sleep(0.05)
    assert not [p for p in pids if watchdog.pid_alive(p)], "a rank outlived spawn"


def test_a_raising_rank_is_named_and_no_process_is_left(tmp_path) -> None:
    start = time.monotonic()
    with pytest.raises(RankError, match="rank 1 failed: ValueError: rank one") as err:
        spawn(_write_pid_then, 3, str(tmp_path / "pid"), "raise", timeout=20)
    assert err.value.rank == 1
    assert time.monotonic() - start < 20  # not the collective timeout: at once
    _assert_gone(str(tmp_path / "pid"), 3)


def test_a_crashing_rank_is_named(tmp_path) -> None:
    with pytest.raises(RankError, match=r"rank 1 failed: process died \(exit code 7\)"):
        spawn(_write_pid_then, 2, str(tmp_path / "pid"), "exit")
    _assert_gone(str(tmp_path / "pid"), 2)


def _sees_then_dies() -> None:
    """Rank 0 fails at once, as a peer of a crashed rank would; rank 1 then dies."""
    if dist.get_rank() == 0:
        raise RuntimeError("Connection reset by peer")
    time.sleep(0.3)
    os._exit(3)


def test_the_rank_that_died_is_named_not_the_one_that_saw_it() -> None:
    """Which pipe is read first is a race: the death must win it."""
    cause = r"rank 1 failed: process died \(exit code 3\); then rank 0 failed"
    with pytest.raises(RankError, match=cause) as err:
        spawn(_sees_then_dies, 2, timeout=10)
    assert err.value.rank == 1


def test_a_hanging_rank_ends_within_the_timeout(tmp_path) -> None:
    """Rank 1 never reaches the barrier: rank 0's barrier times out and is reported."""
    start = time.monotonic()
    with pytest.raises(RankError, match="rank 0 failed") as err:
        spawn(_write_pid_then, 2, str(tmp_path / "pid"), "hang", timeout=2)
    assert time.monotonic() - start < 15
    assert err.value.rank == 0
    _assert_gone(str(tmp_path / "pid"), 2)


def test_the_deadline_bounds_the_whole_call(tmp_path) -> None:
    with pytest.raises(TimeoutError, match=r"ranks \[0, 1\] did not finish"):
        spawn(time.sleep, 2, 3600, init_group=False, deadline=1)


def _init_twice() -> None:
    runtime.init(0, 1, port=0)


def test_initialising_twice_is_a_clear_error() -> None:
    with pytest.raises(RankError, match="already initialised"):
        spawn(_init_twice, 1)


def _collective_without_group() -> str:
    for call in (runtime.require_initialized, runtime.device):
        try:
            call()
        except RuntimeError as err:
            assert "call distcourse.runtime.init" in str(err)
        else:
            raise AssertionError(f"{call.__name__} did not raise")
    try:
        dist.all_reduce(torch.ones(1))
    except (RuntimeError, ValueError) as err:
        return str(err)
    raise AssertionError("all_reduce without a process group did not raise")


def test_a_collective_before_init_is_a_clear_error() -> None:
    [message] = spawn(_collective_without_group, 1, init_group=False)
    assert "not been initialized" in message


def _init_on_port(port: int) -> None:
    runtime.init(0, 1, port=port)


def test_a_port_in_use_is_a_clear_error() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(RankError, match=f"port {port} .* is already in use"):
            spawn(_init_on_port, 1, port, init_group=False)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(rank=2, world_size=2), "rank must be in 0..1"),
        (dict(rank=0, world_size=0), "world_size must be a positive integer"),
        (dict(rank=0, world_size=1, port=70000), "port must be in 0..65535"),
        (dict(rank=0, world_size=1, timeout=-1), "timeout must be a positive"),
        (dict(rank=0, world_size=1, backend="mpi"), "unknown backend"),
    ],
)
def test_init_validates_before_any_network(kwargs: dict, message: str) -> None:
    with socket.socket() as busy:  # an init that listened first would say "in use"
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(ValueError, match=message):
            runtime.init(**{"port": busy.getsockname()[1], **kwargs})
    assert not dist.is_initialized()


def test_pick_backend_on_this_machine() -> None:
    if runtime.gpu_count():
        pytest.skip("CPU-only expectations")
    assert runtime.pick_backend(0, 4) == ("gloo", torch.device("cpu"))
    with pytest.raises(ValueError, match="NCCL needs one GPU per rank"):
        runtime.pick_backend(0, 4, prefer="nccl")
    with pytest.raises(ValueError, match="local_rank=4 outside"):
        runtime.pick_backend(4, 4)


def test_the_test_configuration_picks_gloo_even_when_gpus_exist(monkeypatch) -> None:
    # the root conftest.py is the test configuration: it set DISTCOURSE_DEVICE=cpu
    assert os.environ[runtime.DEVICE_VARIABLE] == "cpu"
    assert runtime.pick_backend(0, 4, gpus=8) == ("gloo", torch.device("cpu"))
    # the same through the chooser's own GPU count, told by torch.cuda that 8 exist
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    assert runtime.gpu_count() == 8
    assert runtime.pick_backend(1, 2) == ("gloo", torch.device("cpu"))
    monkeypatch.delenv(runtime.DEVICE_VARIABLE)  # without it, those GPUs win
    assert runtime.pick_backend(1, 2) == ("nccl", torch.device("cuda", 1))


def test_device_variable_asks_for_cuda_or_fails_clearly(monkeypatch) -> None:
    monkeypatch.setenv(runtime.DEVICE_VARIABLE, "CUDA")
    assert runtime.pick_backend(3, 4, gpus=4) == ("nccl", torch.device("cuda", 3))
    with pytest.raises(ValueError, match="4 ranks on this host, 2 GPUs visible"):
        runtime.pick_backend(0, 4, gpus=2)
    assert runtime.pick_backend(0, 4, prefer="gloo", gpus=4)[0] == "gloo"  # arg wins
    monkeypatch.setenv(runtime.DEVICE_VARIABLE, "gpu")
    with pytest.raises(ValueError, match="DISTCOURSE_DEVICE='gpu': use 'cpu' or"):
        runtime.pick_backend(0, 1, gpus=1)


def _draw(per_rank: bool) -> list[float]:
    runtime.seed_everything(1234, per_rank=per_rank)
    return torch.rand(3).tolist()


def test_seeding_is_reproducible_and_per_rank() -> None:
    first, second = spawn(_draw, 2, True), spawn(_draw, 2, True)
    assert first == second  # same numbers every run
    assert first[0] != first[1]  # different numbers on different ranks
    same = spawn(_draw, 2, False)
    assert same[0] == same[1]


def _print_lines() -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        runtime.print_in_order("hello from", dist.get_rank())
    return out.getvalue()


def test_print_in_order_prints_on_rank_zero_in_rank_order() -> None:
    zero, one, two = spawn(_print_lines, 3)
    assert zero == "".join(f"[rank {r}] hello from {r}\n" for r in range(3))
    assert one == two == ""


def test_no_rank_processes_remain_after_the_tests() -> None:
    spawn(_rank_sum, 2)
    forkserver_children = [
        c for p in psutil.Process().children() for c in p.children(recursive=True)
    ]
    time.sleep(0.2)
    assert not [c for c in forkserver_children if c.is_running()]


def _skip_on_all_but_rank_zero(wait: float) -> str:
    """The classic bug: only rank 0 calls all_reduce. The others outwait the timeout
    (exiting would close their connections and end rank 0's wait early)."""
    if dist.get_rank() != 0:
        time.sleep(wait)
        return str(dist.get_debug_level())
    try:
        dist.all_reduce(torch.ones(1))
    except RuntimeError as err:
        return str(err)
    raise AssertionError("a collective on one rank only did not fail")


def test_debug_names_the_ranks_that_skipped_a_collective() -> None:
    start = time.monotonic()
    zero, *others = spawn(_skip_on_all_but_rank_zero, 4, 3.0, debug=True, timeout=2)
    assert "Ranks 1, 2, 3 failed to pass monitoredBarrier in 2000 ms" in zero
    assert time.monotonic() - start < 15
    assert others == ["DebugLevel.OFF"] * 3  # the level is back once the group exists


def test_without_debug_the_timeout_names_no_rank() -> None:
    zero, _ = spawn(_skip_on_all_but_rank_zero, 2, 3.0, timeout=2)
    assert "Timed out" in zero and "monitoredBarrier" not in zero


def _mismatched_shapes() -> str:
    try:
        dist.all_reduce(torch.ones(dist.get_rank() + 1))
    except RuntimeError as err:
        return str(err)
    raise AssertionError("mismatched all_reduce shapes did not fail")


def test_debug_reports_mismatched_collectives() -> None:
    zero, one = spawn(_mismatched_shapes, 2, debug=True, timeout=5)
    assert "Detected mismatch between collectives" in zero
    assert "Tensor shapes: 1vs 2" in zero and "Tensor shapes: 2vs 1" in one


def test_emulated_device_gives_each_local_rank_its_emulated_gpu(monkeypatch) -> None:
    from distcourse import emulate

    monkeypatch.setenv(runtime.DEVICE_VARIABLE, "emulated")
    backend, device = runtime.pick_backend(1, 2, gpus=0)
    assert backend == runtime.EMULATED_BACKEND
    assert device == torch.device(emulate.DEVICE_TYPE, 1) and emulate.enabled()
    assert torch.get_device_module(emulate.DEVICE_TYPE).device_count() == 2
    monkeypatch.delenv(runtime.DEVICE_VARIABLE)
    assert runtime.pick_backend(0, 2, prefer="emulated", gpus=8)[1].index == 0
