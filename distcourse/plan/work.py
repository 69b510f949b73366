"""The work of a step on one rank, before it becomes seconds (`plan.timing`): the
FLOPs its matmuls run and the bytes its element-wise ops and its optimizer move
through memory.

Notation as in `plan.memory`; S = p v stages, L // S blocks a stage, n = b s // cp
tokens of a micro-batch, N = n // t with sp (the norms and the residual stream
split over tp), n without. The policy's bytes per tensor on the hardware's device
(`parallel.tensor.dtypes.Precision`): r the residual stream, o a norm's output, i a
Linear's kept input, u a matmul output, k_w a kept weight cast, w a weight.

FLOPs, integers, for stage k and one micro-batch (before the split by t):

    forward     (L // S) n (24 h h + 4 s h)  (+ 2 n h V on the last stage)
                (the six matmuls, 12 h h multiply-adds a token; scores and the
                weighted values, 2 s h each)
    recompute   none 0; selective (L // S) 4 n s h (the attention core); full
                (L // S) n (24 h h + 4 s h) (the blocks' forward again)
    stage       3 forward + recompute           (backward = 2 forward)

Bytes the non-matmul ops move, a roofline term (each op reads its inputs and
writes its output once; a matmul's own reads and writes hide behind its FLOPs;
backward moves twice what forward moves, as its FLOPs are twice forward's), per
block and micro-batch on a rank of tp = t, forward:

    N h (2 (r + o) + 2 (2 r + u))   two layer norms (read r, write o) and two
                                    residual adds (read r and the branch's u,
                                    write r)
    + n h (c + 1)(o + i) [autocast] each Linear's cast of its input (c = 3 for
                                    q, k, v; 1 for fc)
    + 8 u n h // t                  GELU (read and write 4h // t)
    + 12 h h // t (w + k_w) [autocast]  the weights cast, per micro-batch

and on the last stage N h (r + o) (the final norm) + n V // t x the policy's
loss_traffic (the log-softmax and its casts) + V h // t (w + k_w) [autocast].
A stage moves 3 x its forward bytes, + the blocks' forward bytes again with full
recompute; autocast's weight gradients (bf16, cast into fp32 .grad) add
12 h h // t (w + k_w) per block, as its forward casts.

Optimizer, bytes per element it steps (once a step): "adamw-fused" 28 (read the
weight, its gradient and both moments, write the weight and the moments: 4 x 4 +
3 x 4); "adamw" (foreach or one tensor at a time) 80 (the moments' lerp_, mul_,
addcmul_, the second moment's sqrt, two div_ and an add_ on it, addcdiv_ into the
weight, the weight decay's mul_: 12 + 8 + 12 + 8 + 8 + 8 + 16 + 8); "sgd" 12;
+ 6 for bf16 weights (the fp32 master's gradient cast in, the weight cast out).
"""

from __future__ import annotations

from distcourse.parallel.tensor.dtypes import Precision
from distcourse.plan import axes
from distcourse.plan.spec import DTypePolicy, ModelSpec, PlanLayout

OPTIMIZER_BYTES = {"adamw-fused": 28, "adamw": 80, "sgd": 12}


def stage_flops(
    model: ModelSpec, b: int, layout: PlanLayout, stage: int, ckpt: str | None = None
) -> int:
    """Forward + backward (+ recompute) FLOPs of a stage for one micro-batch, whole
    (before the split over tp); `ckpt` in place of the layout's."""
    stages = layout.pp * layout.virtual
    n, s, h = b * model.seq // layout.cp, model.seq, model.hidden
    blocks = model.layers // stages
    block = n * (24 * h * h + 4 * s * h) + axes.moe_flops_delta(model, n)
    forward = blocks * block
    if stage == stages - 1:
        forward += 2 * n * h * model.vocab
    recompute = {"none": 0, "selective": blocks * 4 * n * s * h}.get(
        layout.ckpt if ckpt is None else ckpt, blocks * block
    )
    return 3 * forward + recompute


def block_traffic(model: ModelSpec, b: int, layout: PlanLayout, prec: Precision) -> int:
    """Bytes one block's element-wise ops move in a forward on a rank of tp."""
    n, h, t = b * model.seq // layout.cp, model.hidden, layout.tp
    tokens = n // t if layout.sp else n
    r, o, u = (prec.nbytes(k) for k in ("residual", "norm_out", "value"))
    moved = tokens * h * (2 * (r + o) + 2 * (2 * r + u)) + 8 * u * n * h // t
    if prec.casts:
        moved += n * h * (prec.input_copies + 1) * (o + prec.nbytes("input"))
    return moved + weight_casts(12 * h * h // t, prec)


def weight_casts(elements: int, prec: Precision) -> int:
    """Bytes autocast's weight casts move for `elements` weights: read fp32, write
    the cast (0 without autocast)."""
    return elements * (4 + prec.nbytes("weight_copy")) if prec.casts else 0


def stage_traffic(
    model: ModelSpec,
    b: int,
    layout: PlanLayout,
    prec: Precision,
    stage: int,
    ckpt: str | None = None,
) -> int:
    """Bytes a stage's non-matmul ops move for one micro-batch, forward and
    backward (+ recompute), on a rank of tp; `ckpt` in place of the layout's."""
    stages, t = layout.pp * layout.virtual, layout.tp
    n, h, V = b * model.seq // layout.cp, model.hidden, model.vocab
    blocks = model.layers // stages
    forward = blocks * block_traffic(model, b, layout, prec)
    if stage == stages - 1:
        tokens = n // t if layout.sp else n
        r, o = prec.nbytes("residual"), prec.nbytes("norm_out")
        forward += tokens * h * (r + o) + prec.nbytes("loss_traffic") * n * V // t
        forward += weight_casts(V * h // t, prec)
    full = (layout.ckpt if ckpt is None else ckpt) == "full"
    recompute = blocks * block_traffic(model, b, layout, prec) if full else 0
    return 3 * forward + blocks * weight_casts(12 * h * h // t, prec) + recompute


def optimizer_traffic(policy: DTypePolicy, stepped: int) -> int:
    """Bytes the optimizer's step moves for `stepped` elements."""
    extra = 6 if policy.dtype == "bf16" else 0
    return (OPTIMIZER_BYTES[policy.optimizer] + extra) * stepped
