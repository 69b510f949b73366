"""The trainer's model on this rank, built from the layout.

`build` hands a TinyGPT on the meta device (its shape, no memory) to
`parallel.hybrid.HybridGPT`, with `model.init_weights` to draw each stage the
rank owns by name: a rank holds its stages and nothing else, and they equal one
process's (`model.one_process`) tensor for tensor. HybridGPT composes in
torchtitan's order: the pipeline stage cut, split by tensor parallelism, each
block checkpointed ("full"), then the data-parallel axis (buckets, ZeRO-1/2 or
FSDP); bf16 runs under autocast (FSDP: its bf16 parameters).

The optimizer: AdamW (torch's defaults: betas 0.9, 0.999, weight decay 0.01),
fused where torch has a fused kernel for the device (CUDA and the CPU); plain SGD
for checks (`optimizer_options` says which, for one process too).
"""

from __future__ import annotations

from typing import Any

import torch

from distcourse import runtime
from distcourse.examples.gpt import GPTConfig
from distcourse.mesh import Mesh
from distcourse.parallel.hybrid import HybridGPT
from distcourse.train import model as model_mod
from distcourse.train.layout import TrainLayout

FUSED_DEVICES = ("cuda", "cpu")  # where torch's AdamW has a fused kernel


def optimizer_options(optimizer: str, device: torch.device) -> dict[str, Any]:
    """Keyword arguments of the optimizer besides lr: AdamW fused where torch has
    it for `device` (an emulated GPU has none: the foreach loop)."""
    if optimizer == "adamw" and device.type in FUSED_DEVICES:
        return {"fused": True}
    return {}


def build(
    layout: TrainLayout,
    cfg: GPTConfig,
    mesh: Mesh,
    *,
    optimizer: str,
    lr: float,
    seed: int,
    clip: float | None = None,
    timeout: float = runtime.DEFAULT_TIMEOUT,
    meter: bool = False,
) -> HybridGPT:
    """This rank's part of the model of shape `cfg` on the (dp, pp, tp) `mesh`, as
    `layout` composes it. A collective: every rank calls it."""
    piped = layout.pp > 1
    return HybridGPT(
        model_mod.on_meta(cfg),
        mesh,
        micro_batches=layout.micro_batches if piped else 1,
        accum=1 if piped else layout.micro_batches,
        lr=lr,
        optimizer=optimizer,
        timeout=timeout,
        schedule=layout.schedule,
        virtual=layout.virtual,
        ckpt=layout.ckpt,
        data_mode=layout.data_mode,
        dtype=layout.torch_dtype,
        clip=clip,
        init=model_mod.init_weights(seed, cfg.n_layer),
        meter=meter,
        options=optimizer_options(optimizer, runtime.device()),
    )
