"""distcourse.clock: on the CPU synchronize is a no-op and stamps are host times; on
the emulated GPU stamps are device events, and a host read with work pending is
refused."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from distcourse import clock
from distcourse.launch import spawn


def test_synchronize_on_the_cpu_returns() -> None:
    clock.synchronize("cpu")


def test_timer_measures_work_between_its_stamps() -> None:
    timer = clock.DeviceTimer("cpu")
    start = timer.stamp()
    time.sleep(0.02)
    end = timer.stamp()
    assert 0.015 < timer.seconds(start, end) < 1.0


def test_timed_returns_the_seconds_of_the_work() -> None:
    seconds = clock.timed(lambda: torch.ones(64, 64) @ torch.ones(64, 64), "cpu")
    assert 0.0 <= seconds < 1.0


def test_time_puts_cpu_stamps_on_the_host_clock() -> None:
    timer = clock.DeviceTimer("cpu")
    before = time.perf_counter()
    stamp = timer.stamp()
    assert before <= timer.time(stamp) <= time.perf_counter()


def _completion_after_the_work() -> tuple[float, float, float]:
    """On 2 gloo ranks: rank 1 joins an all-reduce 0.2 s late, so rank 0's work
    completes then; its completion stamp is taken then, not at launch."""
    timer = clock.DeviceTimer()
    if dist.get_rank() == 1:
        time.sleep(0.2)
    launched = timer.time(timer.stamp())
    work = dist.all_reduce(torch.ones(4), async_op=True)
    stamped = timer.completion(work)  # asked for at launch, stamped at completion
    done = timer.time(stamped.wait())
    return launched, done, time.perf_counter()


def test_completion_is_stamped_when_the_work_completes() -> None:
    (launched, done, after), _ = spawn(_completion_after_the_work, 2)
    assert done - launched > 0.1 and done <= after


def test_an_emulated_gpu_times_through_device_events() -> None:
    """The GPU path runs on the emulated GPU: a stamp is the device module's event,
    and the seconds between two are read after a synchronize, as on CUDA."""
    from distcourse import emulate

    emulate.setup()
    gpu = emulate.current()
    timer = clock.DeviceTimer(gpu)
    start = timer.stamp()
    x = torch.ones(256, 256, device=gpu) @ torch.ones(256, 256, device=gpu)
    end = timer.stamp()
    assert start.event is not None and start.host is None
    assert timer.seconds(start, end) >= 0.0 and x.device == gpu


def test_a_host_clock_read_with_device_work_pending_is_refused() -> None:
    """Every kernel on the emulated GPU is pending device work until a synchronize:
    the package's host clock refuses to be read then (on a GPU it would time the
    launch), and reads it after the synchronize."""
    import pytest

    from distcourse import emulate
    from distcourse.emulate import timing

    emulate.setup()
    gpu = emulate.current()
    clock.synchronize(gpu)
    torch.ones(8, device=gpu).mul_(2.0)
    with pytest.raises(timing.TimingRuleError, match="timing rule"):
        timing.clock()
    with pytest.raises(timing.TimingRuleError):  # raised again at the synchronize
        clock.synchronize(gpu)
    assert timing.clock() > 0.0  # nothing pending now
