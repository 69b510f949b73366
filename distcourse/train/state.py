"""The trainer's model on this rank, and its state in one-process form.

`build` composes in torchtitan's order: `HybridGPT` cuts the pipeline stage and
splits it by tensor parallelism; activation checkpointing then wraps each block of
the stage (`parallel.checkpointing.Checkpointed`: same parameters, same tensors);
data parallelism averages the gradients in buckets after the last micro-batch.

One-process form: whole tensors under TinyGPT's names, whatever the layout. It is
what a checkpoint holds and what `--compare` compares, so a run saved on 8 ranks
loads on 4 in another layout. `gather` turns this rank's slices (parameters,
gradients or an optimizer moment, one tensor per parameter) into that form (a
collective over the TP group); `scatter` cuts a one-process dict back into this
rank's slices, exactly as the model's own parameters were cut (no message).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from distcourse.examples.gpt import TinyGPT
from distcourse.mesh import Mesh
from distcourse.parallel.checkpointing import Checkpointed
from distcourse.parallel.hybrid import HybridGPT
from distcourse.parallel.hybrid.stages import (
    Embed,
    Head,
    one_process_state,
    parallelize_stage,
    stages,
)
from distcourse.train.layout import TrainLayout
from distcourse.train.sharded import ShardedGPT

Net = HybridGPT | ShardedGPT  # what `build` gives: the trainer's model on a rank
MOMENTS = ("exp_avg", "exp_avg_sq")  # AdamW's state per parameter, beside "step"


def build(
    layout: TrainLayout, model: TinyGPT, mesh: Mesh, *, optimizer: str, lr: float
) -> Net:
    """This rank's part of `model` (not changed) on the (dp, pp, tp) `mesh`: the
    stage, split by TP, each block checkpointed when `layout.ckpt` is "full";
    with `layout.fsdp` (or ZeRO-3), the model sharded over the world."""
    if layout.fsdp or layout.zero == 3:
        return ShardedGPT(model, layout, optimizer=optimizer, lr=lr)
    net = HybridGPT(
        model,
        mesh,
        micro_batches=layout.micro_batches,
        lr=lr,
        optimizer=optimizer,
        schedule=layout.schedule,
    )
    if layout.ckpt == "full":
        for i, layer in enumerate(net.module):
            if not isinstance(layer, Embed | Head):
                net.module[i] = Checkpointed(layer)  # the pipeline holds net.module
    return net


def plain_stage(net: HybridGPT) -> nn.Sequential:
    """The stage's layers without their checkpointing wrappers (same modules)."""
    return nn.Sequential(
        *(m.block if isinstance(m, Checkpointed) else m for m in net.module)
    )


def gather(net: Net, values: list[Tensor] | None = None) -> dict[str, Tensor]:
    """One-process form of this rank's parameters, or of `values` (one tensor per
    parameter, in `net.module.parameters()` order: gradients, AdamW's moments). A
    collective over the TP group (the world under FSDP); the parameters are
    restored afterwards."""
    if isinstance(net, ShardedGPT):
        return net.full(values)
    stage = plain_stage(net)
    params = list(net.module.parameters()) if values is not None else []
    saved = [p.detach().clone() for p in params]
    try:
        with torch.no_grad():
            for p, v in zip(params, values or [], strict=True):
                p.copy_(v)
        full = one_process_state(stage, net.first_layer, net.cfg.n_layer)
        return {k: v.detach().clone() for k, v in full.items()}
    finally:
        with torch.no_grad():
            for p, v in zip(params, saved, strict=True):
                p.copy_(v)


def scatter(net: Net, full: dict[str, Tensor]) -> list[Tensor]:
    """This rank's slices of a one-process dict `full` (TinyGPT's names, every
    key), in `net.module.parameters()` order, on the parameters' device."""
    if isinstance(net, ShardedGPT):
        return net.cut(full)
    model = TinyGPT(net.cfg)
    model.load_state_dict(full)
    mine = stages(model, net.layout.pp)[net.stage]
    if net.layout.tp > 1:
        mine = parallelize_stage(mine, net.mesh.group("tp"), check=False)
    params = list(net.module.parameters())
    cut = [p.detach() for p in mine.parameters()]
    if [c.shape for c in cut] != [p.shape for p in params]:
        raise ValueError("scatter: the cut does not match this rank's parameters")
    return [c.to(p.device).clone() for c, p in zip(cut, params, strict=True)]


def moments(net: Net) -> tuple[int, dict[str, dict[str, Tensor]]]:
    """AdamW's step count and each moment in one-process form (a collective over
    the TP group); (0, {}) before the first step or for plain SGD."""
    params = list(net.module.parameters())
    state = net.optimizer.state
    if not state or not all(p in state for p in params):
        return 0, {}
    step = int(state[params[0]]["step"])
    return step, {k: gather(net, [state[p][k] for p in params]) for k in MOMENTS}


def set_moments(net: Net, step: int, full: dict[str, dict[str, Tensor]]) -> None:
    """Put AdamW's state back from `moments`' form (cut for this rank)."""
    if not full:
        return
    cuts = {k: scatter(net, full[k]) for k in MOMENTS}
    for i, p in enumerate(net.module.parameters()):
        net.optimizer.state[p] = {
            "step": torch.tensor(float(step), dtype=torch.float32),
            **{k: cuts[k][i] for k in MOMENTS},
        }
