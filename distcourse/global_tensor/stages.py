"""2-D + pipeline: a model cut into stages, each stage global on its own placement.

OneFlow's "2D + pipeline": stage k's parameters live on placement k (say
[[0, 1], [2, 3]] and [[4, 5], [6, 7]] for two stages on 8 ranks), each stage keeps
its DP x TP layout (layouts.parallelize), and an activation crosses from stage k to
stage k + 1 by `to_global(placement=...)`: moved forward, its gradient moved back by
the move's backward. Nothing else joins the stages.

Every rank of the world builds a Stages (placements make groups on every rank);
a rank converts only its own stage's part. At each boundary the activation is boxed
to the data signature (S(0), B): the row-parallel layer's P becomes B there (its
all_reduce), so the next stage reads data as its first stage would. A rank of a
stage it does not hold passes `move.absent(...)`: the shape, placement and
signature, no values. Shapes at the boundaries come from running each part on meta
tensors, so every rank knows them without a message.

A step runs GPipe's order: every micro-batch forward, then every backward in the
same order; the ranks of a stage run one after another, the stages overlap only as
the blocking moves allow. The loss is the mean of the micro-batches' losses (each
divided by their number), as one process computes it on the whole batch when the
micro-batches are equal.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from distcourse.comm.ledger import ring_wire_bytes
from distcourse.comm.p2p import HEADER_LEN
from distcourse.global_tensor.layouts import (
    DATA,
    check_plan,
    cut,
    mlp_step_bytes,
    parallelize,
)
from distcourse.global_tensor.move import absent
from distcourse.global_tensor.placement import Placement
from distcourse.global_tensor.sbp import Signature, Split, signature

Loss = Callable[[Tensor, Tensor], Tensor]


class Stages:
    """`parts[k]` (a plain module) on `placements[k]` under `plans[k]`.

    `stage` is this rank's stage (None: it holds none and sits out), `module` its
    parallelized part. Checked on every rank before any group or message: one plan
    per part, placements of one shape and no shared ranks, each plan fitting.
    """

    def __init__(
        self,
        parts: Sequence[nn.Module],
        placements: Sequence[Placement],
        plans: Sequence[dict[str, Any]],
        *,
        data_sbp: Any = DATA,
    ) -> None:
        if not len(parts) == len(placements) == len(plans) or not parts:
            raise ValueError(
                f"Stages: {len(parts)} parts, {len(placements)} "
                f"placements and {len(plans)} plans: give one "
                "placement and one plan per part"
            )
        seen: dict[int, int] = {}
        triples = zip(parts, placements, plans, strict=True)
        for k, (part, pl, plan) in enumerate(triples):
            if getattr(pl, "hierarchy", None) != placements[0].hierarchy:
                raise ValueError(
                    f"Stages: placement {k} is {pl!r}, of another "
                    f"shape than placement 0, "
                    f"{placements[0]!r}"
                )
            check_plan(part, pl, plan)
            for r in pl.grid.flatten().tolist():
                if r in seen:
                    raise ValueError(
                        f"Stages: rank {r} is in placements {seen[r]} "
                        f"and {k}: a rank holds one stage"
                    )
                seen[r] = k
        self.placements = list(placements)
        self.sig: Signature = signature(data_sbp, placements[0].ndim, 2, "data_sbp")
        self.meta = [copy.deepcopy(part).to("meta") for part in parts]
        self.stage = seen.get(dist.get_rank())
        self.module: nn.Module | None = None
        if self.stage is not None:
            k = self.stage
            self.module = parallelize(parts[k], placements[k], plans[k])

    @property
    def last(self) -> int:
        return len(self.placements) - 1

    def shapes(self, batch: torch.Size | tuple[int, ...]) -> list[torch.Size]:
        """The activation's shape into each stage, and out of the last (meta run)."""
        out = [torch.Size(batch)]
        with torch.no_grad():
            for part in self.meta:
                out.append(part(torch.empty(out[-1], device="meta")).shape)
        return out

    def forward(self, x: Tensor, y: Tensor, loss_fn: Loss, m: int) -> Any:
        """One micro-batch through this rank's stage: x and y whole, the same on
        every rank. Returns what its backward needs (None off every stage)."""
        k, pl, sig = self.stage, self.placements, self.sig
        if k is None:
            return None
        shapes = self.shapes(x.shape)
        if k == 0:
            h = cut(x, pl[0], sig)
        else:  # the previous stage's output, moved here
            held = absent(shapes[k], pl[k - 1], sig, x.dtype, requires_grad=True)
            h = held.to_global(placement=pl[k], sbp=sig)
        out = self.module(h).to_global(sbp=sig)
        if k == self.last:
            return loss_fn(out, cut(y, pl[k], sig)) / m
        return out.to_global(placement=pl[k + 1], sbp=sig), shapes[k + 1]

    def backward(self, held: Any) -> None:
        """The backward of what `forward` returned (moves the gradient back)."""
        if held is None:
            return
        if self.stage == self.last:
            held.backward()
            return
        sent, shape = held  # the next stage's input: its gradient comes from there
        q = self.placements[self.stage + 1]
        sent.backward(absent(tuple(shape), q, self.sig, sent.dtype))

    def step(
        self, x: Tensor, y: Tensor, loss_fn: Loss, micro_batches: int = 1
    ) -> float | None:
        """Forward and backward of a batch in `micro_batches` equal parts (GPipe:
        all forwards, then all backwards). Every rank of the world calls it. The
        loss on the last stage's ranks; None on the others."""
        n = x.shape[0] if x.dim() else 0
        if x.dim() < 2 or y.shape[:1] != x.shape[:1]:
            raise ValueError(
                f"Stages.step: x {list(x.shape)} and y {list(y.shape)} "
                "need the same batch dim, x at least 2-D"
            )
        mesh = self.placements[0].hierarchy
        rows = math.prod(
            size for s, size in zip(self.sig, mesh, strict=True) if s == Split(0)
        )
        if micro_batches < 1 or n % (rows * micro_batches):
            raise ValueError(
                f"Stages.step: a batch of {n} rows does not divide into "
                f"{micro_batches} micro-batches of {rows} equal "
                "data-parallel pieces"
            )
        xs, ys = x.chunk(micro_batches), y.chunk(micro_batches)
        pairs = zip(xs, ys, strict=True)
        held = [self.forward(a, b, loss_fn, micro_batches) for a, b in pairs]
        for h in held:
            self.backward(h)
        if self.stage != self.last:
            return None
        return sum(h.detach().full_tensor().item() for h in held)


def pipeline_mlp_bytes(
    stage: int,
    stages: int,
    rows: int,
    c: int,
    hidden: int,
    dp: int,
    tp: int,
    micro_batches: int,
    item: int = 4,
) -> int:
    """Bytes one rank of `stage` puts on the wire in a Stages.step of MLP stages
    (each under dp_tp_plan on a dp x tp placement), as the Ledger counts them.

    Per micro-batch, with a = this rank's piece of the activation (rows / m / dp
    rows of c), h = a p2p header or ack (80 bytes), g(t) = an all_gather on mesh
    dim 0 of t bytes a rank ((dp - 1)t on the wire) and r(t) = an all_reduce on mesh
    dim 1 (2(tp - 1)t / tp):
      every stage   mlp_step_bytes: the row layer's all_reduce, the gradients'
      sending on    the move: g(a) (the pieces), the send (h + a);
                    in backward, the ack of the gradient's receive (h)
      receiving     the ack of the activation's receive (h); in backward, the input
                    gradient's P -> B (r(a): Megatron's f), g(a), send (h + a)
      the last      the loss's all_reduce for `.item()` (item bytes, on mesh dim 0)
    """
    m, h = micro_batches, HEADER_LEN * 8
    a = rows // m // dp * c * item
    gather = ring_wire_bytes("all_gather", a, dp)
    total = mlp_step_bytes(rows // m, c, hidden, dp, tp, item=item)
    if stage < stages - 1:
        total += gather + h + a + h
    if stage > 0:
        total += h + ring_wire_bytes("all_reduce", a, tp) + gather + h + a
    if stage == stages - 1:
        total += ring_wire_bytes("all_reduce", item, dp)
    return m * total
