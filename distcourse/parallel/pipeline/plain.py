"""A pipeline runner to read beside its schedule: receive, run, send.

Each rank walks its list of actions (schedules.py) in order:

    F on stage s, micro-batch j: receive s - 1's activation (stage 0 takes x_j);
       run the stage; the last stage computes loss_j / m, the others send the
       output to s + 1.
    B on stage s, micro-batch j: receive s + 1's gradient of the output (the last
       stage starts from its loss); backward; send the input's gradient to s - 1.

A receive blocks until its tensor arrives; its shape is known in advance, found by
running the stages on "meta" tensors (shapes.py). A send is an isend waited for
at the end of the step: with sends that waited for their receiver, 1F1B's ranks
would both send at once and wait for each other. Dividing each micro-batch's loss
by m makes the gradients those of the whole batch's mean loss. `Pipeline`
(runner.py) runs the same schedules faster: receives posted ahead, shapes agreed
with the neighbours once, the batch checked across ranks while stage 0 computes.

Each link (activations from rank a to rank b, or gradients) has its own group of
two ranks, as `Pipeline`'s links do. On NCCL, tags are ignored (torch's docs of
`send`/`isend`) and the sends and receives of one group run in issue order, a large
send finishing only when its receive runs (NVIDIA/nccl#479): on one shared group, a
rank's send of an activation could wait behind its neighbour's send of a gradient
that waits for it. On a link's own group, one rank only sends, the other only
receives, in the order `schedules.check` proves they agree on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn

from distcourse import runtime
from distcourse.parallel.pipeline import schedules
from distcourse.parallel.pipeline.shapes import Shape, stage_shapes
from distcourse.rendezvous import as_timedelta


class PlainPipeline:
    """This rank's stages of `stages` (stage s on group rank s % p) and its actions.

    Every rank passes the whole batch x to `step` (the shapes it receives follow
    from it), so a bad batch is the same ValueError on every rank, before any
    message. `timeout` (seconds) bounds every receive: a rank that never sends
    becomes an error, not a hang. Every rank of the world builds its PlainPipeline
    at the same time: each link's group is made by all of them, in one order.
    """

    def __init__(
        self,
        stages: Sequence[nn.Module],
        schedule: schedules.Schedule,
        loss_fn: Callable[[Tensor, Tensor], Tensor],
        group: dist.ProcessGroup | None = None,
        timeout: float = runtime.DEFAULT_TIMEOUT,
    ) -> None:
        size = dist.get_world_size(group)
        if schedule.ranks != size or len(stages) != schedule.stages:
            raise ValueError(
                f"schedule {schedule.name!r} runs {schedule.stages} stages on "
                f"{schedule.ranks} ranks; got {len(stages)} stages, {size} ranks"
            )
        schedules.check(schedule)
        schedules.simulate(schedule)  # ValueError if its ranks would deadlock
        self.stages, self.schedule, self.loss_fn = list(stages), schedule, loss_fn
        self.group, me = group, dist.get_rank(group)
        ranks = dist.get_process_group_ranks(group or dist.group.WORLD)
        self.peer = {s: ranks[schedule.rank_of(s)] for s in range(schedule.stages)}
        self.links: dict[tuple[str, int], dist.ProcessGroup] = {}  # (kind, peer)
        for kind, a, b in sorted(schedules.transfers(schedule)):  # one group a link
            link = dist.new_group([ranks[a], ranks[b]], timeout=as_timedelta(timeout))
            if me in (a, b):
                self.links[(kind, ranks[b if me == a else a])] = link
        self.shapes: dict[tuple, list[Shape]] = {}  # per batch shape: found once
        self.local = {s: stages[s] for s in range(me, schedule.stages, size)}
        self.actions = schedule.actions[me]

    def step(self, x: Tensor, target: Tensor | None = None) -> Tensor | None:
        """One forward and backward of the whole batch; gradients accumulate into
        the stages' .grad. Returns the batch's mean loss on the last stage's rank,
        None on the others. target is needed on the last stage's rank."""
        m, last = self.schedule.micro_batches, self.schedule.stages - 1
        if x is None or len(x) < m or len(x) % m:
            got = "no batch" if x is None else f"a batch of {len(x)}"
            raise ValueError(f"got {got}: it must split into {m} equal micro-batches")
        if last in self.local and (target is None or len(target) != len(x)):
            raise ValueError(f"the last stage's rank needs a target of {len(x)} rows")
        key = ((len(x) // m, *x.shape[1:]), x.dtype)
        if key not in self.shapes:  # each stage's input shape, then the output's
            self.shapes[key] = stage_shapes(self.stages, *key)
        shapes = self.shapes[key]
        xs, ys = x.chunk(m), None if target is None else target.chunk(m)
        held: dict[tuple[int, int], tuple[Tensor, Tensor]] = {}  # (s, j): in, out
        sends: list[tuple[dist.Work, Tensor]] = []
        losses: list[Tensor] = []
        for action in self.actions:
            s, j = action.stage, action.micro
            if action.kind == "F":
                if s == 0:
                    inp = xs[j]
                else:
                    inp = self.recv(shapes[s], s - 1, "F")
                    inp.requires_grad_(inp.is_floating_point())
                out = self.local[s](inp)
                if s == last:
                    out = self.loss_fn(out, ys[j]) / m
                    losses.append(out.detach())
                else:
                    sends.append(self.send(out, s + 1, "F"))
                held[(s, j)] = (inp, out)
            else:  # "B"
                inp, out = held.pop((s, j))
                grad = None if s == last else self.recv(shapes[s + 1], s + 1, "B")
                torch.autograd.backward(out, grad)
                if s > 0:
                    sends.append(self.send(inp.grad, s - 1, "B"))
        for work, _ in sends:  # every tensor sent has been received
            work.wait()
        return torch.stack(losses).sum() if losses else None

    def recv(self, shape: Shape, stage: int, kind: str) -> Tensor:
        """Block until `stage` sends the next tensor (of `shape`) of its link of
        `kind`: "F" activations, "B" gradients."""
        buffer = torch.empty(shape[0], dtype=shape[1], device=runtime.device())
        peer = self.peer[stage]
        dist.recv(buffer, peer, group=self.links[(kind, peer)])
        return buffer

    def send(self, x: Tensor, stage: int, kind: str) -> tuple[dist.Work, Tensor]:
        """Start sending x to `stage` on the link of `kind`; the tensor is kept
        until the send is waited."""
        x, peer = x.detach().contiguous(), self.peer[stage]
        return dist.isend(x, peer, group=self.links[(kind, peer)]), x
