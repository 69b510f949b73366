"""Run a schedule: each rank executes its list of actions on the stages it holds.

    F on stage s, micro-batch j: take x_j (first stage) or receive s - 1's
       activation; run the stage; on the last stage compute loss_j / m; otherwise
       send the output to s + 1.
    B on stage s, micro-batch j: backward from loss_j / m (last stage) or from the
       gradient s + 1 sends; send the input's gradient to s - 1. In a schedule
       with W actions (ZB-H1), B computes only that input gradient and
    W on stage s, micro-batch j: the weights' gradients B left (zero_bubble).

Dividing each micro-batch's mean loss by m makes the gradients those of the whole
batch's mean loss, so the result equals one process on the whole batch. Every step
first checks, on every rank and before any send, that the batch splits into m
micro-batches and that each stage's output fits the next stage's input. Each
action's compute is an Event (trace), timed on the device (clock.DeviceTimer: CUDA
events on a GPU, read after the step, so the timing adds no synchronize between
actions), and the bytes of activations each micro-batch saves for backward are
counted, so memory is measured, not assumed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from distcourse import runtime, trace
from distcourse.clock import DeviceTimer
from distcourse.comm.agree import Group, members
from distcourse.parallel.pipeline import schedules, zero_bubble
from distcourse.parallel.pipeline.batch import BatchCheck
from distcourse.parallel.pipeline.links import Links
from distcourse.parallel.pipeline.shapes import Shape, stage_shapes
from distcourse.parallel.pipeline.stats import ActivationMeter
from distcourse.rendezvous import as_timedelta


class Pipeline:
    """This rank's part of a pipeline: its stages, its actions, its links.

    `stages` is the whole split (same on every rank, e.g. split_by_count(model, S));
    the rank of group rank r keeps stages r, r + p, ... A collective: every rank of
    the world constructs its Pipeline at the same time. `handshake` as in Links:
    "first" (shapes agreed on every link when a step meets new ones, then bare
    tensors, receives posted ahead) or "every" (a handshake per transfer).
    `shapes_from`: stages of the same shapes whose forward sends nothing, to find
    the shapes on "meta" in place of `stages` (e.g. the one-process twins of
    tensor-parallel stages, whose collectives cannot run on meta tensors).
    `inputs`: "every" step agrees on the batch's shape across the ranks (a small
    all-gather, overlapped with the first stage's first forward: a bad batch is
    the same ValueError on every rank, before any send; see batch.py), or only the
    "first" step does, as torch's stages infer shapes once; later batches are then
    checked on the ranks that hold them only (a changed one raises there, and its
    neighbours time out naming that rank).
    """

    def __init__(
        self,
        stages: Sequence[nn.Module],
        schedule: schedules.Schedule,
        loss_fn: Callable[[Tensor, Tensor], Tensor],
        group: Group = None,
        timeout: float = runtime.DEFAULT_TIMEOUT,
        handshake: str = "first",
        *,
        shapes_from: Sequence[nn.Module] | None = None,
        inputs: str = "every",
    ) -> None:
        if inputs not in ("every", "first"):
            raise ValueError(f"inputs must be 'every' or 'first', got {inputs!r}")
        g = members(group, "Pipeline")
        if g.size < 2:
            raise ValueError("a pipeline needs at least 2 ranks")
        self.rank, self.ranks = g.ranks[g.rank], g.ranks
        if schedule.ranks != g.size:
            raise ValueError(
                f"schedule {schedule.name!r} is for {schedule.ranks} "
                f"ranks, the group has {g.size}"
            )
        if len(stages) != schedule.stages:
            raise ValueError(
                f"{len(stages)} stages for {schedule.ranks} ranks x "
                f"{schedule.per_rank} stages per rank = {schedule.stages}: more "
                "stages than layers or ranks? split the model into exactly that many"
            )
        schedules.check(schedule)
        schedules.simulate(schedule)  # ValueError if its ranks would deadlock
        if shapes_from is not None and len(shapes_from) != len(stages):
            raise ValueError(
                f"shapes_from has {len(shapes_from)} stages, the pipeline {len(stages)}"
            )
        self.all_stages = list(stages if shapes_from is None else shapes_from)
        self.schedule, self.loss_fn = schedule, loss_fn
        self.local = {s: stages[s] for s in range(g.rank, schedule.stages, g.size)}
        self.actions = schedule.actions[g.rank]
        links = schedules.transfers(schedule)
        mine = [
            (k, self.ranks[a], self.ranks[b]) for k, a, b in links if g.rank in (a, b)
        ]
        self.links = Links(mine, as_timedelta(timeout), handshake)
        self.transfers = {
            (k, self.ranks[a], self.ranks[b]): order
            for (k, a, b), order in links.items()
            if g.rank in (a, b)
        }
        self.group = g.group
        self.spans = trace.Spans(DeviceTimer())  # this rank's device
        self.meter = ActivationMeter(self.local.values())
        self.shapes: dict[tuple, list[Shape]] = {}
        self.later: dict[tuple[int, int], Callable[[], None]] = {}  # B's W
        self.plans: dict[tuple, tuple[dict, dict]] = {}  # per key: sends, receives
        self.batch = BatchCheck(
            self.ranks,
            g.group,
            self.rank_of(0),
            self.rank_of(schedule.stages - 1),
            schedule.stages,
            schedule.micro_batches,
            self.describe,
            every=inputs == "every",
        )
        self.begun = self.beginning = False

    def rank_of(self, stage: int) -> int:
        """Global rank holding `stage`."""
        return self.ranks[self.schedule.rank_of(stage)]

    def describe(self, stage: int) -> str:
        return f"stage {stage} (rank {self.rank_of(stage)})"

    # ------------------------------------------------------------- a step ------

    def step(
        self, x: Tensor | None = None, target: Tensor | None = None
    ) -> Tensor | None:
        """One forward and backward of the whole batch; gradients accumulate into the
        stages' .grad. Returns the batch's mean loss on the last stage's rank, None on
        the others. x is needed on the first stage's rank, target on the last's."""
        self.batch.start(x, target)  # the agreement runs while stage 0 computes
        early = self.batch.key_of(x) if self.rank == self.rank_of(0) else None
        if early is not None:
            try:  # the shapes x alone implies: fine, or the agreement raises below
                self._shapes(early)
            except ValueError:
                early = None
        self.begun = self.beginning = False
        if early is None:  # nothing to compute before the first transfer
            try:
                self._begin()
            except Exception as err:  # named as the first action that waited on it
                raise self._located(self.actions[0], err) from err
        m = self.schedule.micro_batches
        xs = None if x is None else x.chunk(m)
        ys = None if target is None else target.chunk(m)
        self.spans.clear()  # this step's only
        self.meter.reset()
        held: dict[tuple[int, int], tuple[Tensor, Tensor]] = {}  # inputs, outputs
        losses: list[Tensor] = []
        for a in self.actions:
            try:
                if a.kind == "F":
                    losses += self._forward(a, xs, ys, held)
                elif a.kind == "B":
                    self._backward(a, held)
                else:
                    self._weight(a)
            except Exception as err:
                raise self._located(a, err) from err
        try:
            self.links.flush()
        except Exception as err:
            raise RuntimeError(f"rank {self.rank}: {err}") from err
        return torch.stack(losses).sum() if losses else None

    def _located(self, a: schedules.Action, err: Exception) -> Exception:
        """`err` prefixed with the stage, action and micro-batch it stopped; a batch
        or shapes refused by the agreement stays as it is (the same on every rank)."""
        if self.beginning and isinstance(err, ValueError):
            return err
        cls = ValueError if isinstance(err, ValueError) else RuntimeError
        return cls(
            f"{self.describe(a.stage)}, {a.kind} of micro-batch {a.micro}: {err}"
        )

    def _shapes(self, key: tuple) -> list[Shape]:
        """Each stage's input shape for micro-batches of `key`; computed once per key
        (raises ValueError alike on every rank, before any send)."""
        if key not in self.shapes:
            self.shapes[key] = stage_shapes(self.all_stages, *key, self.describe)
        return self.shapes[key]

    def _begin(self) -> None:
        """Wait for the batch's agreement, then start the links: the step's first
        transfer waits for this (see batch.py). Its errors are every rank's alike.
        Once per step: later calls return at once."""
        if self.begun:
            return
        self.beginning = True
        key = self.batch.result()
        self.now = self._shapes(key)
        if key not in self.plans:  # what each link carries, in order: once per key
            self.plans[key] = self._plan(self.now)
        # new shapes are agreed with the neighbours before anything else is sent
        self.links.begin(*self.plans[key], self.describe, key=key)
        self.begun, self.beginning = True, False

    def _plan(self, shapes: list[Shape]) -> tuple[dict, dict]:
        """What this rank sends and receives on each link, in order, as (sending
        stage, shape): activations of stage s are shapes[s + 1], the gradients it
        sends back shapes[s]."""
        sends: dict = {}
        recvs: dict = {}
        for link, (sent, received) in self.transfers.items():
            up = 1 if link[0] == "F" else 0
            if link[1] == self.rank:
                sends[link] = [(s, shapes[s + up]) for s, _ in sent]
            if link[2] == self.rank:
                recvs[link] = [(s, shapes[s + up]) for s, _ in received]
        return sends, recvs

    def _forward(self, a, xs, ys, held) -> list[Tensor]:
        s, j, last = a.stage, a.micro, self.schedule.stages - 1
        if s == 0:
            inp = xs[j]
        else:
            self._begin()
            link = ("F", self.rank_of(s - 1), self.rank)
            inp = self.links.recv(link, self.now[s])
            inp.requires_grad_(inp.is_floating_point())
        with self.spans.span(f"F {s} {j}"), self.meter.saving((s, j)):
            out = self.local[s](inp)
            if s == last:
                out = self.loss_fn(out, ys[j]) / self.schedule.micro_batches
        if s < last:  # first the send: the next stage may be waiting
            self._begin()
            link = ("F", self.rank, self.rank_of(s + 1))
            self.links.send(link, out, self.now[s + 1])
        self.meter.hold((s, j), out)
        held[(s, j)] = (inp, out)
        return [out.detach()] if s == last else []

    def _backward(self, a, held) -> None:
        s, j, last = a.stage, a.micro, self.schedule.stages - 1
        self._begin()
        inp, out = held.pop((s, j))
        grad = None
        if s < last:
            link = ("B", self.rank_of(s + 1), self.rank)
            grad = self.links.recv(link, (out.shape, out.dtype))
        with self.spans.span(f"B {s} {j}"):
            if self.schedule.split:  # the input's gradient now, the weights' in W
                params = list(self.local[s].parameters())
                self.later[(s, j)] = zero_bubble.backward_input(out, grad, inp, params)
            else:
                torch.autograd.backward(out, grad)
        if s > 0:  # first the send: the previous stage may be waiting
            self.links.send(
                ("B", self.rank, self.rank_of(s - 1)), inp.grad, self.now[s]
            )
        if not self.schedule.split:
            self.meter.release((s, j))

    def _weight(self, a) -> None:
        """W: the weights' gradients that B left; the micro-batch's graph is freed."""
        weight = self.later.pop((a.stage, a.micro))
        with self.spans.span(f"W {a.stage} {a.micro}"):
            weight()
        self.meter.release((a.stage, a.micro))

    @property
    def events(self) -> list[trace.Event]:
        """The last step's actions as Events, in device time (read on first use)."""
        return self.spans.events()

    def close(self) -> None:
        """Stop the sender threads."""
        self.links.close()
