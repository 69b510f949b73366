"""What a schedule cost: activation memory held, and the bubble from measured events.

Memory: while a micro-batch's forward runs, a saved-tensor hook sees every tensor
autograd keeps for the backward; their bytes (parameters excluded, each tensor once)
plus the stage output are held until that micro-batch's backward. The peak over the
step is what a schedule costs in activations: GPipe holds all m micro-batches,
1F1B at most p on the first rank.

Bubble: of the p ranks' time between the first action's start and the last one's
end, the share no action was computing. Events are device-time spans placed on the
host's time.perf_counter() axis (clock.DeviceTimer.time), one clock for all
processes of one machine.

Ideal step: a stage's forward and backward timed alone on one micro-batch
(`stage_times`), put into the schedule on paper with free transfers
(`ideal_step`): what a pipeline of exactly these stages would take if running it
cost nothing beyond their compute. Measured step over that is the runner's
efficiency; small micro-batches that compute badly lower the ideal, not it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from distcourse import trace
from distcourse.clock import DeviceTimer
from distcourse.parallel.pipeline import schedules


class ActivationMeter:
    """Bytes of activations held for backward, now and at the peak, on one rank."""

    def __init__(self, modules: Iterable[nn.Module]) -> None:
        self.params = {p.data_ptr() for mod in modules for p in mod.parameters()}
        self.reset()

    def reset(self) -> None:
        self.held: dict[object, dict[tuple, int]] = {}
        self.now = self.peak = self.peak_count = 0

    def _add(self, key: object, t: Tensor) -> None:
        if t.data_ptr() in self.params or not t.numel():
            return
        seen = self.held.setdefault(key, {})
        ident = (t.data_ptr(), t.numel(), t.dtype)
        if ident not in seen:
            seen[ident] = t.numel() * t.element_size()
            self.now += seen[ident]
            self.peak = max(self.peak, self.now)
        self.peak_count = max(self.peak_count, len(self.held))

    @contextmanager
    def saving(self, key: object) -> Iterator[None]:
        """Count what autograd saves inside this block as held by `key`."""

        def pack(t: Tensor) -> Tensor:
            self._add(key, t)
            return t

        self.held.setdefault(key, {})
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield

    def hold(self, key: object, t: Tensor) -> None:
        """Count `t` (a stage output kept for backward) as held by `key`."""
        self._add(key, t)

    def release(self, key: object) -> None:
        """The backward of `key` ran: its activations are freed."""
        self.now -= sum(self.held.pop(key, {}).values())


def parse(event: trace.Event) -> tuple[str, int, int]:
    """(kind, stage, micro-batch) of a pipeline event named like 'F 2 5'."""
    kind, stage, micro = event.name.split()
    return kind, int(stage), int(micro)


def bubble(per_rank: Sequence[Sequence[trace.Event | tuple]]) -> float:
    """Idle share of all ranks' time over the step: 1 - busy / (p x span)."""
    ranks = [trace.as_events(evs) for evs in per_rank]
    start = min(e.start for evs in ranks for e in evs)
    end = max(e.end for evs in ranks for e in evs)
    busy = sum(trace.covered(evs) for evs in ranks)
    return 1.0 - busy / (len(ranks) * (end - start))


def stage_times(stage: nn.Module, x: Tensor, repeats: int = 5) -> tuple[float, float]:
    """Median seconds of `stage`'s forward and of its backward (from a gradient of
    ones) on the micro-batch x. The parameters' gradients accumulate into .grad
    (zero them after if they matter), as from one micro-batch to the next."""
    forward, backward = [], []
    timer = DeviceTimer(x.device)  # device time: a GPU runs work after it is queued
    for _ in range(repeats):
        inp = x.detach().requires_grad_(x.is_floating_point())
        start = timer.stamp()
        out = stage(inp)
        mid = timer.stamp()
        out.backward(torch.ones_like(out))
        forward.append(timer.seconds(start, mid))
        backward.append(timer.seconds(mid, timer.stamp()))
    return sorted(forward)[repeats // 2], sorted(backward)[repeats // 2]


def ideal_step(
    schedule: schedules.Schedule, forward: Sequence[float], backward: Sequence[float]
) -> float:
    """Seconds a step of `schedule` takes on paper with these per-stage forward and
    backward times and free transfers: the ideal pipeline of those stages."""
    runs = schedules.simulate(schedule, forward, backward)
    return max(end for acts in runs for _, _, end in acts)


def micro_batch_cost(
    sizes: Sequence[float], ms_per_micro_batch: Sequence[float]
) -> tuple[float, float]:
    """Least-squares fit of a stage's compute per micro-batch as fixed + per_sample x
    size: (fixed, per_sample), in the unit given. The fixed part is paid again by
    every micro-batch (kernel launches, each weight read and its gradient written
    once per micro-batch whatever its size), so it sets how small a split still
    pays: (m + p - 1)(fixed + per_sample x batch / m) grows again once the fixed
    parts added outweigh the bubble removed."""
    if len(sizes) != len(ms_per_micro_batch) or len(set(sizes)) < 2:
        raise ValueError("need times for at least 2 different micro-batch sizes")
    a = torch.tensor([[1.0, float(s)] for s in sizes], dtype=torch.float64)
    b = torch.tensor([[float(t)] for t in ms_per_micro_batch], dtype=torch.float64)
    fixed, per_sample = torch.linalg.lstsq(a, b).solution.flatten().tolist()
    return fixed, per_sample


def held_as_predicted(
    meter: ActivationMeter, schedule: schedules.Schedule, rank: int
) -> bool:
    """Did group rank `rank` hold, at its peak, as many micro-batches' activations
    as `in_flight` predicts from the schedule alone (GPipe m, 1F1B p - rank)?"""
    return meter.peak_count == schedules.in_flight(schedule)[rank]


class StageTimer:
    """This rank's stage on one micro-batch x: each `step()` times its forward and
    backward (`stage_times`, once) into `times`. Run on every rank at once, in the
    same rounds as the real steps (a benchmark's runners take turns), it gives the
    actions of an ideal pipeline under the load the real steps met."""

    def __init__(self, stage: nn.Module, x: Tensor) -> None:
        self.stage, self.x = stage, x
        self.times: list[tuple[float, float]] = []

    def step(self, *batch: Tensor) -> None:
        self.times.append(stage_times(self.stage, self.x, repeats=1))


def efficiency(
    schedule: schedules.Schedule, rounds: Sequence, steps: Sequence[float]
) -> tuple[float, float]:
    """(ideal seconds, efficiency) of a runner: rounds[i][rank] = (forward,
    backward) of each rank's stage timed alone in round i (one stage per rank),
    steps[i] the measured step of that round. Efficiency is the median over the
    rounds of ideal_i / step_i: each round's own ratio, so load drifts cancel.
    Near 1 the runner costs nothing measurable; it can pass 1 (noise, and a real
    pipe's fill and drain run one rank at a time, faster than both at once)."""
    ideals = [ideal_step(schedule, *zip(*ranks, strict=True)) for ranks in rounds]
    ratios = [i / t for i, t in zip(ideals, steps, strict=True)]
    return _median(ideals), _median(ratios)


def extra_per_micro_batch(ms: Sequence[int], alone: Sequence) -> float:
    """Compute seconds each extra micro-batch adds to a stage's step, the busier
    stage's: m micro-batches of batch / m against ms[0]'s, over the range of ms;
    alone[k][round][rank] = (forward, backward) at ms[k], medians over rounds."""
    work = [
        [m * _median([f + b for f, b in ranks]) for ranks in zip(*rounds, strict=True)]
        for m, rounds in zip(ms, alone, strict=True)
    ]
    return max(
        (work[-1][s] - work[0][s]) / (ms[-1] - ms[0]) for s in range(len(work[0]))
    )


def _median(values: Sequence[float]) -> float:
    return sorted(values)[(len(values) - 1) // 2]
