"""Faults planted in data parallelism, shared by the chapters' negative controls.

Each one is a bug a reader could write, run through the real DDP (ours or torch's),
so a control shows the chapter's own check catching it. (No `from __future__ import
annotations` here: both DDPs read a comm hook's annotations as objects.)
"""

import torch
import torch.distributed as dist


def summed_hook(
    state: object, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """A DDP comm hook that all-reduces each bucket and never divides by the world
    size: gradients summed over the ranks, not averaged. (torch's `allreduce_hook`
    is this with the division; both DDPs take it through `register_comm_hook`.)"""
    work = dist.all_reduce(bucket.buffer(), async_op=True)
    return work.get_future().then(lambda done: done.value()[0])
