"""distcourse.clock on the CPU: synchronize is a no-op there, stamps are host times."""

from __future__ import annotations

import time

import torch

from distcourse import clock


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
