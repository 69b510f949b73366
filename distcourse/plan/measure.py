"""A layout of chapter 10 run on this rank, its peak memory and wire bytes measured.

`run(name, cfg, batches)` trains TinyGPT under one data-parallel layout of
`LAYOUTS` on the current process group (every rank calls it), with AdamW in fp32,
and measures the last step:

- `peak`: the most bytes alive at once during the step, model state included
  (`allocations.PeakMemory`, from before the model exists: what the rank holds is
  all counted; on a GPU the allocator's own counter);
- `wire`: the bytes this rank put on the wire in the step (`comm.ledger.Ledger`,
  the book's ring convention);
- `activations`: what the forward and loss of one micro-batch keep for backward
  (saved-tensor hooks; parameters and gathered weights left out).

`predict(name, cfg, batch, world)` is the planner's `Prediction` for the same
layout. The strategies are the book's own: chapter 3b's DDP (`parallel.ddp.DDP`,
whose all-reduces the ledger sees; torch's run from C++), chapter 9's `FlatZero`
(stages 1 and 2, buckets of `BUCKET_MB`) and `fsdp.fully_shard` per block and root.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from distcourse import runtime
from distcourse.allocations import PeakMemory
from distcourse.comm.ledger import Ledger
from distcourse.examples.gpt import GPTConfig, TinyGPT, lm_loss
from distcourse.parallel import fsdp, zero
from distcourse.parallel.ddp import DDP
from distcourse.plan.hardware import Hardware
from distcourse.plan.prediction import Prediction
from distcourse.plan.prediction import predict as plan_predict
from distcourse.plan.spec import DTypePolicy, ModelSpec, PlanLayout

BUCKET_MB = 0.25  # small buckets: ZeRO-2 holds one at a time, never the whole
LAYOUTS: dict[str, dict[str, Any]] = {  # name -> PlanLayout fields (dp = the world)
    "DP": dict(bucket_view=True),
    "ZeRO-1": dict(zero=1, bucket_view=True),
    "ZeRO-2": dict(zero=2),
    "ZeRO-3": dict(zero=3),
    "ZeRO-3, kept": dict(zero=3, reshard=False),
    "ZeRO-3, m 2": dict(zero=3, micro_batches=2),
}
FP32 = DTypePolicy("fp32", "fp32", "adamw")


def layout_of(name: str, world: int) -> PlanLayout:
    """The planner's layout of `LAYOUTS[name]` on `world` data-parallel ranks."""
    if name not in LAYOUTS:
        raise ValueError(f"unknown layout {name!r}; known: {', '.join(LAYOUTS)}")
    return PlanLayout(dp=world, **LAYOUTS[name])


def predict(
    name: str, cfg: GPTConfig, batch: int, world: int, hw: Hardware
) -> Prediction:
    """The planner's prediction of layout `name` for TinyGPT(`cfg`), fp32 AdamW."""
    model = ModelSpec.from_config(cfg)
    return plan_predict(model, batch, FP32, layout_of(name, world), hw)


def compared(got: dict, planned: Prediction) -> tuple[float, bool]:
    """(measured peak / the plan's total, whether the wire bytes and the
    activations equal the plan's exactly) for one rank's `run` result."""
    same = got["wire"] == planned.wire["dp"]
    same = same and got["activations"] == planned.memory["activations"]
    return got["peak"] / planned.memory["total"], same


def build(name: str, cfg: GPTConfig) -> tuple[nn.Module, torch.optim.Optimizer]:
    """TinyGPT under layout `name` on this rank's device, and its optimizer."""
    fields, device = LAYOUTS[name], runtime.device()
    model = TinyGPT(cfg).to(device)
    stage = fields.get("zero", 0)
    if stage == 0:
        net = DDP(model, bucket_cap_mb=BUCKET_MB, gradient_as_bucket_view=True)
        return net, torch.optim.AdamW(model.parameters(), lr=1e-3)
    if stage in (1, 2):
        flat = zero.FlatZero(
            model, torch.optim.AdamW, stage=stage, bucket_cap_mb=BUCKET_MB, lr=1e-3
        )
        return flat, flat.optimizer
    keep = fields.get("reshard", True)
    for block in model.blocks:
        fsdp.fully_shard(block, reshard_after_forward=keep)
    fsdp.fully_shard(model, reshard_after_forward=keep)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def activation_bytes(net: nn.Module, loss_of: Callable[[], Tensor]) -> int:
    """What `loss_of()` keeps for backward: each storage once, leaving out the
    parameters and FSDP's gathered weights (the planner counts those apart)."""
    params = {p.untyped_storage().data_ptr() for p in net.parameters()}
    units = fsdp.units(net)
    seen: dict[int, int] = {}

    def pack(t: Tensor) -> Tensor:
        key = t.untyped_storage().data_ptr()
        gathered = {u.buffer.untyped_storage().data_ptr() for u in units}
        if key not in params and key not in gathered:
            seen[key] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = loss_of()
    loss.backward()
    return sum(seen.values())


def step(
    net: nn.Module, opt: torch.optim.Optimizer, x: Tensor, y: Tensor, m: int
) -> None:
    """One optimizer step over `m` micro-batches of the rank's rows (each a
    backward of its own: the gradients accumulate)."""
    opt.zero_grad(set_to_none=True)
    for xs, ys in zip(x.chunk(m), y.chunk(m), strict=True):
        (lm_loss(net(xs), ys) / m).backward()
    opt.step()


def run(name: str, cfg: GPTConfig, batches: list[tuple[Tensor, Tensor]]) -> dict:
    """Train layout `name` on this rank's rows of `batches` (global batches, the
    same on every rank); the last step measured. Returns its peak, wire and
    activation bytes."""
    rank, world, device = dist.get_rank(), dist.get_world_size(), runtime.device()
    m = LAYOUTS[name].get("micro_batches", 1)
    mine = [
        (
            x.chunk(world)[rank].clone().to(device),
            y.chunk(world)[rank].clone().to(device),
        )
        for x, y in batches
    ]
    torch.manual_seed(0)
    with PeakMemory(device) as memory:
        net, opt = build(name, cfg)
        for x, y in mine[:-1]:
            step(net, opt, x, y, m)
        memory.restart()  # the last step's peak
        with Ledger() as ledger:
            step(net, opt, *mine[-1], m)
    x, y = mine[-1]
    first = x.chunk(m)[0].clone(), y.chunk(m)[0].clone()  # storages of their own
    kept = activation_bytes(net, lambda: lm_loss(net(first[0]), first[1]))
    opt.zero_grad(set_to_none=True)
    return dict(peak=memory.peak, wire=ledger.bytes_sent(), activations=kept)
