"""`--fsdp` (or `--zero 3`) on a data-parallel layout: TinyGPT under the book's
FSDP (chapter 9's `parallel.fsdp.fully_shard`), with HybridGPT's interface.

`fully_shard` makes each block a unit and the root the last one; the optimizer
is built afterwards on the pieces. Activation checkpointing is refused with it
(`layout.refuse_pairs`): torchtitan's order, checkpointing then FSDP, recomputes
a block after its unit resharded (measured: "weight of shape [8]", a piece, in
the recompute), and FSDP inside the checkpoint crashed a rank (signal 11).
A step: this rank's rows of the batch (B / dp), forward, backward (each unit's gradients
reduce-scattered and averaged over the world), the optimizer on the pieces.

One-process form: `full` gathers every parameter whole (one all-gather per unit),
or any per-parameter tensors (gradients, AdamW's moments) by the same path;
`cut` keeps this rank's rows of a whole dict (`fsdp.local_pieces`, no message).
A checkpoint of this model loads into any layout's, and any layout's into it.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import Tensor

from distcourse import runtime
from distcourse.examples.gpt import TinyGPT, lm_loss
from distcourse.parallel.fsdp import full_state_dict, fully_shard, local_pieces
from distcourse.parallel.hybrid.runner import OPTIMIZERS
from distcourse.train.layout import TrainLayout


class ShardedGPT:
    """This rank's pieces of `model` (not changed) under FSDP over the world."""

    def __init__(
        self, model: TinyGPT, layout: TrainLayout, *, optimizer: str, lr: float
    ) -> None:
        if layout.pp * layout.tp != 1:
            raise ValueError(f"ShardedGPT shards a data-parallel layout, not {layout}")
        self.layout, self.cfg = layout, model.cfg
        module = copy.deepcopy(model).to(runtime.device())
        for block in module.blocks:
            fully_shard(block)
        self.module = fully_shard(module)
        self.optimizer = OPTIMIZERS[optimizer](self.module.parameters(), lr=lr)
        self.moments = 2 if optimizer == "adamw" else 0

    def step(self, x: Tensor, y: Tensor) -> float:
        """One step on the whole batch (x, y), given on every rank; the batch's
        mean loss on every rank."""
        b, rank = len(x) // self.layout.dp, dist.get_rank()
        device = runtime.device()
        x, y = x[rank * b : (rank + 1) * b].to(device), y[rank * b : (rank + 1) * b]
        self.optimizer.zero_grad(set_to_none=True)
        loss = lm_loss(self.module(x), y.to(device))
        loss.backward()
        self.optimizer.step()
        total = loss.detach().double().reshape(1)
        dist.all_reduce(total)
        return total.item() / self.layout.dp

    def full(self, values: list[Tensor] | None = None) -> dict[str, Tensor]:
        """Whole tensors under TinyGPT's names: the parameters, or `values` (one
        per parameter, in `module.parameters()` order). A collective."""
        params = list(self.module.parameters()) if values is not None else []
        saved = [p.detach().clone() for p in params]
        try:
            with torch.no_grad():
                for p, v in zip(params, values or [], strict=True):
                    p.copy_(v)
            state = full_state_dict(self.module)
        finally:
            with torch.no_grad():
                for p, v in zip(params, saved, strict=True):
                    p.copy_(v)
        return {k: v.clone() for k, v in state.items()}

    def cut(self, full: dict[str, Tensor]) -> list[Tensor]:
        """This rank's pieces of a one-process dict, in `module.parameters()`
        order, on the parameters' device (no message)."""
        names = [n for n, _ in self.module.named_parameters()]
        pieces = local_pieces(self.module, {n: full[n] for n in names})
        params = list(self.module.parameters())
        return [
            pieces[n].to(p.device).clone() for n, p in zip(names, params, strict=True)
        ]

    def held(self) -> dict[str, int]:
        """Bytes of this rank's pieces: parameters, gradients, optimizer state
        (activations are not metered here: 0)."""
        params = sum(p.numel() * p.element_size() for p in self.module.parameters())
        return dict(
            params=params, grads=params, optimizer=self.moments * params, activations=0
        )

    def close(self) -> None:
        """Nothing to stop (HybridGPT's interface)."""
