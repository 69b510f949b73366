"""The same stages run by torch.distributed.pipelining, to compare with ours.

torch's PipelineStage wraps one stage and infers the shapes it sends at the first
step; its schedules (ScheduleGPipe, Schedule1F1B, ScheduleInterleaved1F1B, and the
zero-bubble family: ScheduleInterleavedZeroBubble, ScheduleZBVZeroBubble,
ScheduleDualPipeV) execute their own action lists with non-blocking isend/irecv.
Each micro-batch's loss counts 1/m of the batch's, as ours, so losses and gradients
should match ours. Placement: one stage per rank, or stage s on rank s % p
(interleaved), or the "V" of ZBV and DualPipeV: rank r holds stages r and
2p - 1 - r, so the first rank holds the first and the last stage. On gloo it has
hung in the past: callers run it under a finite group timeout.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn

from distcourse import runtime, torchcompat
from distcourse.comm.agree import Group, members

CLASSES = {  # name -> (torch's class name, placement)
    "GPipe": ("ScheduleGPipe", "one"),
    "1F1B": ("Schedule1F1B", "one"),
    "interleaved 1F1B": ("ScheduleInterleaved1F1B", "interleaved"),
    "interleaved zero bubble": ("ScheduleInterleavedZeroBubble", "interleaved"),
    "ZBV zero bubble": ("ScheduleZBVZeroBubble", "V"),
    "DualPipeV": ("ScheduleDualPipeV", "V"),
}
SCHEDULES = tuple(CLASSES)


def stages_of(rank: int, ranks: int, stages: int, placement: str) -> list[int]:
    """The stages `rank` of `ranks` holds under a placement of `stages` stages."""
    if placement == "V":
        return [rank, 2 * ranks - 1 - rank]
    return list(range(rank, stages, ranks))


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

        if name not in SCHEDULES:
            raise ValueError(f"unknown schedule {name!r}; one of {SCHEDULES}")
        g = members(group, "TorchPipeline")
        cls_name, placement = CLASSES[name]
        n = len(stages)
        need = {
            "one": n == g.size,
            "V": n == 2 * g.size,
            "interleaved": n % g.size == 0 and n > 0,
        }[placement]
        if not need:
            want = {
                "one": "one stage per rank",
                "V": "two stages per rank (a V)",
                "interleaved": "as many stages on every rank",
            }[placement]
            raise ValueError(f"{name} runs {want}: {n} stages, {g.size} ranks")
        gloo = dist.get_backend(g.group) == "gloo"
        if placement == "V" and gloo and not torchcompat.V_SCHEDULES_ON_GLOO:
            raise NotImplementedError(
                f"{name} on gloo needs torch 2.14 or newer: on torch "
                f"{torchcompat.TORCH} its stages fail to connect (torchcompat)"
            )
        dev = runtime.device()
        self.mine = stages_of(g.rank, g.size, n, placement)
        self.stages = [
            pipelining.PipelineStage(stages[s], s, n, dev, group=g.group)
            for s in self.mine
        ]
        cls = getattr(pipelining, cls_name)
        arg = self.stages[0] if placement == "one" else self.stages
        self.schedule = cls(arg, micro_batches, loss_fn=loss_fn)
        self.first = 0 in self.mine
        self.last = len(stages) - 1 in self.mine
        self.m = micro_batches

    def step(
        self, x: Tensor | None = None, target: Tensor | None = None
    ) -> Tensor | None:
        """One forward and backward; the batch's mean loss on the last stage's rank."""
        losses: list[Tensor] = []
        args = (x,) if self.first else ()
        kwargs = dict(target=target, losses=losses) if self.last else {}
        self.schedule.step(*args, **kwargs)
        return torch.stack(losses).sum().detach() / self.m if self.last else None
