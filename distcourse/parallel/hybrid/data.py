"""What the data-parallel axis does with a rank's stages: four ways, one interface.

- "ddp": chapter 3's buckets, all-reduced over the dp group after the step's last
  backward (`HybridGPT.average_gradients`); every replica holds everything.
- "zero1", "zero2": chapter 9's `FlatZero` over the dp group: each replica steps
  1/dp of the (TP-sliced) stage, its optimizer state only there; stage 1 keeps
  the whole gradient until the step's last backward and reduce-scatters once
  (`reduce_once`), stage 2 reduce-scatters each backward, bucket by bucket.
- "fsdp": chapter 9's `fully_shard` over the dp group, each block a unit and
  each stage a root (ZeRO-3): after tensor parallelism, so a rank holds 1/dp of
  its TP slices (torchtitan's 2-D order, `fsdp_tp`). With activation
  checkpointing a block keeps its gathered parameters from forward to backward
  (reshard_after_forward=False): the book's unit frees them after every forward,
  the recompute's in backward included, which would free what backward reads.
  bf16 here is FSDP's MixedPrecisionPolicy (bf16 parameters, fp32 reduce), not
  autocast.

Each mode says where the tensors it steps sit in the one-process model
(`placement.Box`): the parameters, the gradients after the reduce, and the
optimizer's state, for checkpoints and `--compare`; and which of them count once
toward the gradient norm (`norm_terms`: a replica's copy counts 1/dp, a tensor
every TP rank holds 1/tp, a ZeRO or FSDP piece once).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn

from distcourse.parallel import fsdp
from distcourse.parallel.hybrid.placement import Box
from distcourse.parallel.hybrid.stages import Embed, Head
from distcourse.parallel.zero import FlatZero

MODES = ("ddp", "zero1", "zero2", "fsdp")
Local = list[tuple[Box, Tensor]]  # a rank's tensors, each with its place


def shard(
    stages: Sequence[nn.Sequential],
    mesh: object,
    *,
    keep_gathered: bool,
    dtype: torch.dtype | None,
) -> None:
    """`fully_shard` each block (the one inside a checkpointing wrapper, so its
    recompute gathers too), then each stage as a root, over `mesh` (the dp axis).
    `dtype`: FSDP's MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=fp32)."""
    policy = None
    if dtype is not None and dtype != torch.float32:
        policy = fsdp.MixedPrecisionPolicy(dtype, torch.float32)
    for stage in stages:
        for layer in stage:
            if isinstance(layer, Embed | Head):
                continue
            block = getattr(layer, "block", layer)  # inside Checkpointed
            fsdp.fully_shard(
                block,
                mesh=mesh,
                reshard_after_forward=False if keep_gathered else None,
                mp_policy=policy,
            )
        fsdp.fully_shard(stage, mesh=mesh, mp_policy=policy)


def piece_boxes(module: nn.Module, boxes: list[Box]) -> list[Box | None]:
    """Each FSDP piece's Box (None where this rank's piece has no rows), in
    `module.parameters()` order: its rows of the TP slice's box."""
    cut = {
        id(s): pc
        for u in fsdp.units(module)
        for pc, s in zip(u.pieces, u.sharded, strict=True)
    }
    out: list[Box | None] = []
    for p, box in zip(module.parameters(), boxes, strict=True):
        piece = cut.get(id(p))
        if piece is None:
            out.append(box)
        elif piece.rows == 0:
            out.append(None)
        else:
            out.append(box.rows(piece.rank * piece.chunk, piece.rows))
    return out


Runs = list[list[tuple[Box, slice, int]]]  # per FlatZero piece: box, slice, param


def flat_runs(flat: FlatZero, boxes: list[Box]) -> Runs:
    """For each of this rank's FlatZero pieces (one per region): the boxes of the
    parameters' elements it holds, each with its slice of the piece and the
    parameter's index."""
    layout, out = flat.layout, []
    for region in layout.regions:
        part = region.piece(flat.rank, flat.world)
        found = []
        for i, at, n in zip(region.params, region.offsets, region.numels, strict=True):
            lo, hi = max(at, part.start), min(at + n, part.stop)
            for box in boxes[i].runs(lo - at, hi - at) if lo < hi else []:
                where = slice(lo - part.start, lo - part.start + box.numel)
                found.append((box, where, i))
                lo += box.numel
        out.append(found)
    return out


def reduce_once(flat: FlatZero) -> None:
    """ZeRO-1 after a step's backward passes ran without sync: the summed whole
    gradient reduce-scattered region by region, once (its flat gradient zeroed)."""
    assert flat.grad_flat is not None
    flat.set_requires_gradient_sync(True)
    for region in flat.layout.regions:
        flat.reduce_region(region.index, flat.grad_flat[region.span()])
    flat.grad_flat.zero_()


def norm_weights(
    mode: str,
    replicated: list[bool],
    tp: int,
    dp: int,
    flat: FlatZero | None = None,
    runs: Runs | None = None,
) -> list[float | Tensor]:
    """One weight per tensor the optimizer steps (the parameters; a FlatZero's
    pieces), such that the weighted sum of their gradients' squares, summed over
    the world, is the square of the one-process gradient norm: a replica's copy
    (ddp) counts 1/dp, a tensor every TP rank holds whole 1/tp, a piece once (a
    piece's elements weighed one by one: it mixes parameters, and its padding
    counts nothing)."""
    if flat is not None and runs is not None:
        weights: list[float | Tensor] = []
        for piece, found in zip(flat.pieces, runs, strict=True):
            weight = torch.zeros_like(piece)
            for _, where, i in found:
                weight[where] = 1 / tp if replicated[i] else 1.0
            weights.append(weight)
        return weights
    share = 1 / dp if mode == "ddp" else 1.0
    return [share / tp if rep else share for rep in replicated]


def global_norm(
    stepped: list[Tensor], weights: list[float | Tensor], group: object
) -> Tensor:
    """sqrt of the weighted sum of the gradients' squares over the world (one
    all-reduce, on the device: no host sync)."""
    total = torch.zeros((), dtype=torch.float32, device=stepped[0].device)
    for p, weight in zip(stepped, weights, strict=True):
        if p.grad is not None:
            total += (p.grad.float().square() * weight).sum()
    dist.all_reduce(total, group=group)
    return total.sqrt()


def clip_(grads: list[Tensor], norm: Tensor, max_norm: float) -> None:
    """Scale every gradient by min(1, max_norm / (norm + 1e-6)), torch's rule."""
    coef = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(coef.to(g.dtype))
