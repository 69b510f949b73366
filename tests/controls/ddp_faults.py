"""Faults planted in data parallelism, shared by the chapters' negative controls.

Each one is a bug a reader could write, run through the real DDP (ours or torch's),
so a control shows the chapter's own check catching it. (No `from __future__ import
annotations` here: both DDPs read a comm hook's annotations as objects.)
"""

from typing import Any

import torch
import torch.distributed as dist

from distcourse.parallel.ddp import DDP


def summed_hook(
    state: object, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """A DDP comm hook that all-reduces each bucket and never divides by the world
    size: gradients summed over the ranks, not averaged. (torch's `allreduce_hook`
    is this with the division; both DDPs take it through `register_comm_hook`.)"""
    work = dist.all_reduce(bucket.buffer(), async_op=True)
    return work.get_future().then(lambda done: done.value()[0])


class SummingDDP(DDP):
    """Our DDP with `summed_hook` registered: it sums the ranks' gradients."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.register_comm_hook(None, summed_hook)


class UnsyncedDDP(DDP):
    """Our DDP that never copies rank 0's weights to the others (`init_sync=False`):
    each replica starts from its own."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs, init_sync=False)
