"""ZeRO stage 2 beside our DDP: gradients reduce-scattered into their owners.

`ShardedDDP(module, optimizer)` wraps a module as DDP does, but where DDP all-reduces
every gradient (each rank ends with all of them), it asks the
`ZeroRedundancyOptimizer` to reduce-scatter them when the last one of a backward has
arrived: each rank keeps the averaged gradients of the parameters it owns, and the
others' become None. With the optimizer's all-gather after the step, a step moves
what DDP's all-reduce moves (a ring all-reduce is a reduce-scatter then an
all-gather), while gradients and optimizer state both shrink to 1/N.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from distcourse.comm.agree import agree_tensors
from distcourse.parallel.zero.optimizer import ZeroRedundancyOptimizer


class ShardedDDP(nn.Module):
    """`module`, with gradients reduce-scattered by `optimizer` after each backward.

    Rank 0's parameters and buffers are copied to every rank at construction, as
    DDP does, after the ranks agree on their names, shapes and dtypes (a model of
    another shape on one rank: a ValueError naming it, on every rank). Every
    parameter must get a gradient in every backward (no unused parameters): the
    reduce-scatter runs when the last one has arrived.
    """

    def __init__(self, module: nn.Module, optimizer: ZeroRedundancyOptimizer) -> None:
        super().__init__()
        if not isinstance(optimizer, ZeroRedundancyOptimizer):
            raise TypeError(
                "ShardedDDP needs distcourse's ZeroRedundancyOptimizer (it owns the "
                f"partition the gradients are scattered by), got {type(optimizer)}"
            )
        params = [p for p in module.parameters() if p.requires_grad]
        owned = {p for g in optimizer.param_groups for p in g["params"]}

        def holds_them() -> None:
            if set(params) != owned:
                raise ValueError(
                    "ShardedDDP: the optimizer must hold exactly the module's "
                    "trainable parameters (build it on module.parameters())"
                )

        agree_tensors(  # the broadcasts below need the same tensors on every rank
            "ShardedDDP",
            [*module.named_parameters(), *module.named_buffers()],
            optimizer.process_group,
            validate=holds_them,
        )
        self.module = module
        self.optimizer = optimizer
        self.arrived = 0
        with torch.no_grad():
            for tensor in [*module.parameters(), *module.buffers()]:
                dist.broadcast(
                    tensor, dist.get_global_rank(self.group, 0), group=self.group
                )
        for p in params:
            p.register_post_accumulate_grad_hook(self._on_gradient)
        self.expected = len(params)

    @property
    def group(self) -> Any:
        """The process group of the optimizer (the world if None)."""
        return self.optimizer.process_group or dist.group.WORLD

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The module's forward; a new backward's gradients are counted from zero."""
        self.arrived = 0
        return self.module(*args, **kwargs)

    def _on_gradient(self, _param: torch.Tensor) -> None:
        self.arrived += 1
        if self.arrived == self.expected:
            self.optimizer.reduce_scatter_gradients()
