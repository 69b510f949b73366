"""distcourse.clock on the CPU: synchronize is a no-op there, stamps are host times."""

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
