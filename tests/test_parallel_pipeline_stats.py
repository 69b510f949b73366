"""The bubble from events and the activation meter, on hand-made cases."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from distcourse import trace
from distcourse.parallel.pipeline import stats


def test_bubble_is_the_idle_share_of_all_ranks_time() -> None:
    # rank 0 busy 0-2, rank 1 busy 1-3: a span of 3 on 2 ranks, 4 busy -> 1/3 idle
    assert stats.bubble([[("F 0 0", 0, 2)], [("F 1 0", 1, 3)]]) == pytest.approx(1 / 3)
    # overlapping spans on one rank count once
    events = [[trace.Event("F 0 0", 0, 2), trace.Event("B 0 0", 1, 2)], [("x", 0, 2)]]
    assert stats.bubble(events) == pytest.approx(0.0)
    assert stats.parse(trace.Event("B 3 12", 0.0, 1.0)) == ("B", 3, 12)


def test_meter_counts_saved_activations_not_parameters() -> None:
    layer = nn.Linear(100, 100)
    meter = stats.ActivationMeter([layer])
    x = torch.randn(10, 100, requires_grad=True)
    with meter.saving("a"):
        y = torch.tanh(layer(x))  # saves x (4000 bytes) and tanh's output (4000)
    meter.hold("a", y)  # the output is tanh's saved tensor: counted once
    assert meter.now == meter.peak == 8000 and meter.peak_count == 1
    with meter.saving("b"):
        layer(x)  # saves the same x again: b holds it too
    assert meter.now == 12000
    meter.release("a")
    meter.release("b")
    assert meter.now == 0 and meter.peak == 12000 and meter.peak_count == 2


def test_ideal_step_puts_timed_stages_into_the_schedule_on_paper() -> None:
    from distcourse.parallel.pipeline import schedules

    # GPipe, 2 stages, m = 2: F0 0-1 1-2; F1 1-2 2-3; B1 3-5 5-7; B0 5-7 7-9
    assert stats.ideal_step(schedules.gpipe(2, 2), [1.0, 1.0], [2.0, 2.0]) == 9.0
    layer = nn.Linear(8, 8)
    forward, backward = stats.stage_times(layer, torch.randn(4, 8), repeats=3)
    assert forward > 0 and backward > 0
    assert layer.weight.grad is not None  # accumulated, as micro-batches do


def test_efficiency_is_each_rounds_ideal_over_its_step() -> None:
    from distcourse.parallel.pipeline import schedules

    gpipe = schedules.gpipe(2, 2)  # ideal 9 s with F = 1, B = 2 on both stages
    rounds = [[(1.0, 2.0), (1.0, 2.0)], [(2.0, 4.0), (2.0, 4.0)]]  # ideal 9, 18
    ideal, efficiency = stats.efficiency(gpipe, rounds, [10.0, 18.0])
    assert (ideal, efficiency) == (9.0, 0.9)  # lower medians of (9, 18), (.9, 1)
    # 2 micro-batches cost a stage 2 x (1 + 2) = 6 s against 4 s for one of twice
    # the size: each extra micro-batch adds 2 s to that stage
    alone = [[[(2.0, 2.0), (1.0, 1.0)]], [[(1.0, 2.0), (0.5, 0.5)]]]
    assert stats.extra_per_micro_batch([1, 2], alone) == 2.0
    timer = stats.StageTimer(nn.Linear(4, 4), torch.randn(2, 4))
    timer.step()
    timer.step(torch.ones(1))  # a runner's step(x, y): the batch is not used
    assert len(timer.times) == 2 and all(f > 0 and b > 0 for f, b in timer.times)
