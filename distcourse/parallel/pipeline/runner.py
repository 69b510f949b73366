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
action's compute is an Event (trace), and the bytes of activations each micro-batch
saves for backward are counted, so memory is measured, not assumed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn

from distcourse import runtime, trace
from distcourse.comm import p2p
from distcourse.comm.agree import Group, members
from distcourse.parallel.pipeline import schedules, zero_bubble
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
    all-gather: a bad batch is the same ValueError on every rank), or only the
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
        self.inputs, self.agreed = inputs, None
        if g.size < 2:
            raise ValueError("a pipeline needs at least 2 ranks")
        self.rank, self.ranks = g.ranks[g.rank], g.ranks
        if schedule.ranks != g.size:
            raise ValueError(f"schedule {schedule.name!r} is for {schedule.ranks} "
                             f"ranks, the group has {g.size}")  # fmt: skip
        if len(stages) != schedule.stages:
            raise ValueError(
                f"{len(stages)} stages for {schedule.ranks} ranks x "
                f"{schedule.per_rank} stages per rank = {schedule.stages}: more "
                "stages than layers or ranks? split the model into exactly that many"
            )
        schedules.check(schedule)
        schedules.simulate(schedule)  # ValueError if its ranks would deadlock
        if shapes_from is not None and len(shapes_from) != len(stages):
            raise ValueError(f"shapes_from has {len(shapes_from)} stages, the "
                             f"pipeline {len(stages)}")  # fmt: skip
        self.all_stages = list(stages if shapes_from is None else shapes_from)
        self.schedule, self.loss_fn = schedule, loss_fn
        self.local = {s: stages[s] for s in range(g.rank, schedule.stages, g.size)}
        self.actions = schedule.actions[g.rank]
        links = schedules.transfers(schedule)
        mine = [(k, self.ranks[a], self.ranks[b]) for k, a, b in links
                if g.rank in (a, b)]  # fmt: skip
        self.links = Links(mine, as_timedelta(timeout), handshake)
        self.transfers = {(k, self.ranks[a], self.ranks[b]): order
                          for (k, a, b), order in links.items()
                          if g.rank in (a, b)}  # fmt: skip
        self.group = g.group
        self.events: list[trace.Event] = []
        self.meter = ActivationMeter(self.local.values())
        self.shapes: dict[tuple, list[Shape]] = {}
        self.later: dict[tuple[int, int], Callable[[], None]] = {}  # B's W
        self.plans: dict[tuple, tuple[dict, dict]] = {}  # per key: sends, receives

    def rank_of(self, stage: int) -> int:
        """Global rank holding `stage`."""
        return self.ranks[self.schedule.rank_of(stage)]

    def describe(self, stage: int) -> str:
        return f"stage {stage} (rank {self.rank_of(stage)})"

    # ------------------------------------------------------------ checks ------

    def _agree(self, x: Tensor | None, target: Tensor | None) -> tuple:
        """Every rank learns the input's shape and dtype and the target's batch size,
        and all raise the same ValueError if they do not fit the schedule."""
        row = [-1] * (3 + p2p.MAX_DIMS)  # dtype, ndim, shape..., target batch
        if x is not None and (x.dtype not in p2p.DTYPES or x.dim() > p2p.MAX_DIMS):
            row[0] = -2  # every rank raises below, after the all-gather
        elif x is not None:
            row[: 2 + x.dim()] = [p2p.DTYPES.index(x.dtype), x.dim(), *x.shape]
        if target is not None:
            row[-1] = len(target)
        mine = torch.tensor(row, dtype=torch.int64, device=runtime.device())
        seen = [torch.empty_like(mine) for _ in self.ranks]
        dist.all_gather(seen, mine, group=self.group)  # one small message per rank
        first, last = self.rank_of(0), self.rank_of(self.schedule.stages - 1)
        head, tail = (seen[self.ranks.index(r)].tolist() for r in (first, last))
        if head[0] == -2:
            raise ValueError(
                f"{self.describe(0)}: an input that p2p cannot send "
                f"(dtypes {p2p.DTYPES}, at most {p2p.MAX_DIMS} dims)"
            )
        if head[0] < 0:
            raise ValueError(f"{self.describe(0)} needs the input batch x")
        if tail[-1] < 0:
            raise ValueError(f"{self.describe(self.schedule.stages - 1)} needs the "
                             "target batch")  # fmt: skip
        shape, dtype = head[2 : 2 + head[1]], p2p.DTYPES[head[0]]
        batch, m = shape[0] if shape else 0, self.schedule.micro_batches
        if batch % m or batch == 0:
            raise ValueError(f"{self.describe(0)}: a batch of {batch} does not split "
                             f"into {m} equal micro-batches")  # fmt: skip
        if tail[-1] != batch:
            where = self.describe(self.schedule.stages - 1)
            raise ValueError(f"{where}: target batch {tail[-1]} != input "
                             f"batch {batch}")  # fmt: skip
        return (batch // m, *shape[1:]), dtype

    def _check_same(self, x: Tensor | None, target: Tensor | None,
                    micro_shape: tuple, dtype: torch.dtype) -> None:  # fmt: skip
        """With inputs="first": this rank's batch has the first step's shape."""
        m = self.schedule.micro_batches
        if x is not None:
            got = (x.dtype, len(x) % m, (len(x) // m, *x.shape[1:]))
            if got != (dtype, 0, tuple(micro_shape)):
                raise ValueError(
                    f"{self.describe(0)}: inputs='first' agreed on batches of "
                    f"{m} x {dtype} {list(micro_shape)}; this one is {x.dtype} "
                    f"{list(x.shape)}"
                )
        if target is not None and len(target) != micro_shape[0] * m:
            where = self.describe(self.schedule.stages - 1)
            raise ValueError(f"{where}: target batch {len(target)} != the agreed "
                             f"{micro_shape[0] * m}")  # fmt: skip

    # ------------------------------------------------------------- a step ------

    def step(self, x: Tensor | None = None, target: Tensor | None = None
             ) -> Tensor | None:  # fmt: skip
        """One forward and backward of the whole batch; gradients accumulate into the
        stages' .grad. Returns the batch's mean loss on the last stage's rank, None on
        the others. x is needed on the first stage's rank, target on the last's."""
        if self.inputs == "every" or self.agreed is None:
            self.agreed = self._agree(x, target)
        else:
            self._check_same(x, target, *self.agreed)
        micro_shape, dtype = self.agreed
        key = (micro_shape, dtype)
        if key not in self.shapes:  # raises ValueError on every rank, before a send
            self.shapes[key] = stage_shapes(self.all_stages, micro_shape, dtype,
                                            self.describe)  # fmt: skip
        shapes, m = self.shapes[key], self.schedule.micro_batches
        if key not in self.plans:  # what each link carries, in order: once per key
            self.plans[key] = self._plan(shapes)
        # new shapes are agreed with the neighbours before anything else is sent
        self.links.begin(*self.plans[key], self.describe, key=key)
        xs = None if x is None else x.chunk(m)
        ys = None if target is None else target.chunk(m)
        self.events = []  # this step's only
        self.meter.reset()
        held: dict[tuple[int, int], tuple[Tensor, Tensor]] = {}  # inputs, outputs
        losses: list[Tensor] = []
        for a in self.actions:
            try:
                if a.kind == "F":
                    losses += self._forward(a, xs, ys, shapes, held)
                elif a.kind == "B":
                    self._backward(a, shapes, held)
                else:
                    self._weight(a)
            except Exception as err:
                cls = ValueError if isinstance(err, ValueError) else RuntimeError
                raise cls(f"{self.describe(a.stage)}, {a.kind} of micro-batch "
                          f"{a.micro}: {err}") from err  # fmt: skip
        try:
            self.links.flush()
        except Exception as err:
            raise RuntimeError(f"rank {self.rank}: {err}") from err
        return torch.stack(losses).sum() if losses else None

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

    def _forward(self, a, xs, ys, shapes, held) -> list[Tensor]:
        s, j, last = a.stage, a.micro, self.schedule.stages - 1
        if s == 0:
            inp = xs[j]
        else:
            link = ("F", self.rank_of(s - 1), self.rank)
            inp = self.links.recv(link, shapes[s])
            inp.requires_grad_(inp.is_floating_point())
        with trace.span(self.events, f"F {s} {j}"), self.meter.saving((s, j)):
            out = self.local[s](inp)
            if s == last:
                out = self.loss_fn(out, ys[j]) / self.schedule.micro_batches
        self.meter.hold((s, j), out)
        held[(s, j)] = (inp, out)
        if s == last:
            return [out.detach()]
        self.links.send(("F", self.rank, self.rank_of(s + 1)), out, shapes[s + 1])
        return []

    def _backward(self, a, shapes, held) -> None:
        s, j, last = a.stage, a.micro, self.schedule.stages - 1
        inp, out = held.pop((s, j))
        grad = None
        if s < last:
            link = ("B", self.rank_of(s + 1), self.rank)
            grad = self.links.recv(link, (out.shape, out.dtype))
        with trace.span(self.events, f"B {s} {j}"):
            if self.schedule.split:  # the input's gradient now, the weights' in W
                params = list(self.local[s].parameters())
                self.later[(s, j)] = zero_bubble.backward_input(out, grad, inp, params)
            else:
                torch.autograd.backward(out, grad)
                self.meter.release((s, j))
        if s > 0:
            self.links.send(("B", self.rank, self.rank_of(s - 1)), inp.grad,
                            shapes[s])  # fmt: skip

    def _weight(self, a) -> None:
        """W: the weights' gradients that B left; the micro-batch's graph is freed."""
        weight = self.later.pop((a.stage, a.micro))
        with trace.span(self.events, f"W {a.stage} {a.micro}"):
            weight()
        self.meter.release((a.stage, a.micro))

    def close(self) -> None:
        """Stop the sender threads."""
        self.links.close()
