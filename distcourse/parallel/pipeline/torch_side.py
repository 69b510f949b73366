"""The same stages run by torch.distributed.pipelining, to compare with ours.

torch's PipelineStage wraps one stage and infers the shapes it sends at the first
step; its schedules (ScheduleGPipe, Schedule1F1B, ScheduleInterleaved1F1B) execute
their own action lists with non-blocking isend/irecv. It scales each micro-batch's
loss by 1/m as we do, so losses and gradients should match ours. On gloo it has hung
in the past: callers run it under a finite group timeout.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from distcourse import runtime
from distcourse.comm.agree import Group, members

SCHEDULES = ("GPipe", "1F1B", "interleaved 1F1B")


class TorchPipeline:
    """This rank's stages under a torch.distributed.pipelining schedule by name."""

    def __init__(
        self,
        stages: Sequence[nn.Module],
        name: str,
        micro_batches: int,
        loss_fn: Callable[[Tensor, Tensor], Tensor],
        group: Group = None,
    ) -> None:
        from torch.distributed import pipelining  # imports torch._dynamo: slow

        g = members(group, "TorchPipeline")
        if name not in SCHEDULES:
            raise ValueError(f"unknown schedule {name!r}; one of {SCHEDULES}")
        interleaved = name == "interleaved 1F1B"
        if not interleaved and len(stages) != g.size:
            raise ValueError(f"{name} runs one stage per rank: {len(stages)} stages, "
                             f"{g.size} ranks")  # fmt: skip
        dev = runtime.device()
        self.mine = list(range(g.rank, len(stages), g.size))
        self.stages = [
            pipelining.PipelineStage(stages[s], s, len(stages), dev, group=g.group)
            for s in self.mine
        ]
        cls = {
            "GPipe": pipelining.ScheduleGPipe,
            "1F1B": pipelining.Schedule1F1B,
            "interleaved 1F1B": pipelining.ScheduleInterleaved1F1B,
        }[name]
        arg = self.stages if interleaved else self.stages[0]
        self.schedule = cls(arg, micro_batches, loss_fn=loss_fn)
        self.first = 0 in self.mine
        self.last = len(stages) - 1 in self.mine
        self.m = micro_batches

    def step(self, x: Tensor | None = None, target: Tensor | None = None
             ) -> Tensor | None:  # fmt: skip
        """One forward and backward; the batch's mean loss on the last stage's rank."""
        losses: list[Tensor] = []
        args = (x,) if self.first else ()
        kwargs = dict(target=target, losses=losses) if self.last else {}
        self.schedule.step(*args, **kwargs)
        return torch.stack(losses).sum().detach() / self.m if self.last else None
