"""A rank builds its own pipeline stages, and nothing else of the model.

`own_stages` copies only the layers of the stages this rank runs out of the model's
chain (chapter 5's cut; `virtual` stages per rank for interleaved 1F1B, stage
`r + k x pp` on pipeline rank r). The model may live on the "meta" device (no
memory at all): then each stage is allocated on the host, filled by `init(name,
tensor)` under its one-process name (the same numbers one process draws for the
same name, whatever rank draws them), and moved to the rank's device. The other
stages exist only as meta twins (`twins`), whose shapes the pipeline needs to
post its receives: a rank of a 4-stage pipeline holds a quarter of the model's
parameters, not all of them.

Then, in torchtitan's order, `parallelize_stage` splits each layer over the TP
group (chapter 4's layers, agreeing on shapes when a forward meets new ones),
and `checkpointed` wraps each block in activation checkpointing (chapter 10).
`Autocast` runs a stage's forward under `torch.autocast` (bf16 matmuls, fp32
weights): the pipeline calls it as it calls any stage.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import set_checkpoint_early_stop

from distcourse.examples.gpt import TinyGPT
from distcourse.parallel.checkpointing import Checkpointed
from distcourse.parallel.hybrid.stages import (
    Embed,
    Head,
    as_chain,
    bounds,
    layer_prefix,
)
from distcourse.parallel.pipeline import split_at
from distcourse.parallel.pipeline.shapes import on_meta

Init = Callable[[str, Tensor], None]  # fills one-process parameter `name` in place


def chain_stages(model: TinyGPT, n_stages: int) -> list[nn.Sequential]:
    """The model's chain cut into `n_stages` stages, sharing its parameters (no
    copy). ValueError if the blocks do not divide into them."""
    if model.cfg.n_layer % n_stages:
        raise ValueError(
            f"n_layer={model.cfg.n_layer} blocks do not divide into "
            f"{n_stages} pipeline stages"
        )
    return split_at(as_chain(model), bounds(model.cfg.n_layer, n_stages))


def first_layers(n_layer: int, n_stages: int) -> list[int]:
    """Chain index of each stage's first layer."""
    return bounds(n_layer, n_stages)[:-1]


def on_meta_device(model: nn.Module) -> bool:
    """True if any of `model`'s parameters is a meta tensor (no data)."""
    return any(p.is_meta for p in model.parameters())


def own_stages(
    model: TinyGPT,
    n_stages: int,
    mine: list[int],
    device: torch.device,
    init: Init | None = None,
) -> dict[int, nn.Sequential]:
    """Stages `mine` of the chain, as copies on `device` (only theirs are copied).
    A model on meta needs `init`: each copy is drawn on the host by name."""
    chain = chain_stages(model, n_stages)
    firsts = first_layers(model.cfg.n_layer, n_stages)
    out = {}
    for s in mine:
        stage = copy.deepcopy(chain[s])
        if on_meta_device(stage):
            if init is None:
                raise ValueError("a model on the meta device needs init= to fill it")
            stage = stage.to_empty(device="cpu")
            fill(stage, firsts[s], model.cfg.n_layer, init)
        out[s] = stage.to(device)
    return out


def fill(stage: nn.Sequential, first: int, n_layer: int, init: Init) -> None:
    """Every parameter of `stage` drawn by `init` under its one-process name, and
    every buffer zeroed (TinyGPT has none)."""
    with torch.no_grad():
        for i, layer in enumerate(stage):
            prefix = layer_prefix(first + i, n_layer)
            for name, p in layer.named_parameters():
                init(prefix + name, p)
            for b in layer.buffers():
                b.zero_()


def twins(model: TinyGPT, n_stages: int, dtype: torch.dtype | None = None) -> list:
    """Every stage as a meta twin (no data): the shapes the pipeline plans with.
    `dtype`: the twins' floating dtype, where the stages compute in another one
    (FSDP's bf16 parameters)."""
    stages = [on_meta(s) for s in chain_stages(model, n_stages)]
    return [s.to(dtype) if dtype is not None else s for s in stages]


class Recomputed(Checkpointed):
    """Chapter 10's `Checkpointed` with torch's early stop off: the recompute in
    backward runs the whole block, so the block's forward hooks run to their
    end. With early stop (torch's default) the recompute is cut off once the
    saved tensors backward needs are made, and an FSDP unit's post-forward hook,
    which hands the modules back their pieces, never runs."""

    def forward(self, x: Tensor) -> Tensor:
        with set_checkpoint_early_stop(False):
            return super().forward(x)


def checkpointed(stage: nn.Sequential) -> nn.Sequential:
    """`stage` with each block (not Embed, not Head) under activation
    checkpointing: the same parameters, recomputed in backward."""
    for i, layer in enumerate(stage):
        if not isinstance(layer, Embed | Head):
            stage[i] = Recomputed(layer)
    return stage


def plain(stage: nn.Sequential) -> nn.Sequential:
    """The stage's layers without their checkpointing wrappers (same modules)."""
    return nn.Sequential(
        *(m.block if isinstance(m, Checkpointed) else m for m in stage)
    )


class Autocast(nn.Module):
    """A stage run under `torch.autocast(device_type, dtype)`: matmuls and attention
    in `dtype`, weights and what autocast keeps in float32 (norms, the residual
    stream) as they are. Same parameters as `stage`."""

    def __init__(self, stage: nn.Module, device_type: str, dtype: torch.dtype) -> None:
        super().__init__()
        self.stage, self.device_type, self.dtype = stage, device_type, dtype

    def forward(self, x: Tensor) -> Tensor:
        with torch.autocast(self.device_type, dtype=self.dtype):
            return self.stage(x)
