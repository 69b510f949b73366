"""Seconds of one training step: compute, the pipeline's bubble, and each axis's
messages under the alpha-beta model (chapter 2), with no overlap between them.

Notation as in `plan.memory`; R the hardware's rate for the policy's dtype
(`Hardware.rate`), and a link's (alpha, beta) per axis: with TP innermost (the grid
arange(world).view(dp, pp, tp)), tp runs inside a node while t <= GPUs per node,
pp while t p does, dp while d t p does; beyond, on the network
(`parallel.hybrid.recipe.links`).

Compute. A block's forward costs n (24 h^2 + 4 s h) FLOPs per micro-batch (the
six matmuls, 12 h^2 multiply-adds a token; scores and weighted values, 2 s h
each); the head's 2 n h V. Backward is twice the forward. Checkpointing adds a
forward in backward: full, the block's whole forward; selective, the attention
core (4 n s h). Each is split t ways. One rank's micro-batch time U is the sum
over its stages of (3 F + recompute) / (t R); the slowest rank's sets the pace:

    compute = m U          bubble = (p - 1) / v x U    (0 when p = 1)

Messages, per step, on the busiest pipeline rank (bytes are wire bytes,
`comm.ledger.ring_wire_bytes`: all-reduce 2(k-1)/k x S, all-gather and
reduce-scatter (k-1)/k x S each, on a ring of k):

    tp  per micro-batch and stage: 4 all-reduces per block (forward g and
        backward f, attention and MLP), one more on stage 0 (the embedding) and
        on the last stage (the head's f), each of A = n h e bytes; the last stage
        also 3 of 4 n bytes (the loss's max, sum and target logit, fp32).
        Sequence parallelism swaps each for an all-gather and a reduce-scatter:
        the same bytes and alpha steps. Time: 2 (t - 1) alpha per all-reduce
        + bytes x beta.
    pp  per micro-batch and stage: A forward unless the stage is last, A
        backward unless it is first; alpha + A beta each.
    dp  once per step on the rank's P parameters: ZeRO 0 all-reduce of P r;
        ZeRO 1 that + all-gather of P w; ZeRO 2 reduce-scatter of P r +
        all-gather of P w; ZeRO 3 two all-gathers of P w (forward and backward)
        + reduce-scatter of P r. Time: (k - 1) alpha per all-gather or
        reduce-scatter, 2 (k - 1) per all-reduce, + bytes x beta.

    step = compute + bubble + tp + pp + dp (seconds; an upper bound: nothing
    overlaps).
"""

from __future__ import annotations

from distcourse.comm.ledger import ring_wire_bytes
from distcourse.parallel.hybrid.layout import Layout
from distcourse.parallel.hybrid.recipe import Machine, links
from distcourse.plan.hardware import Hardware
from distcourse.plan.memory import rank_stages, stage_params
from distcourse.plan.spec import DTypePolicy, ModelSpec, PlanLayout

AXES = ("tp", "pp", "dp")
DP_COLLECTIVES = {  # ZeRO stage -> (op, which bytes) in one step
    0: (("all_reduce", "grad"),),
    1: (("all_reduce", "grad"), ("all_gather", "weight")),
    2: (("reduce_scatter", "grad"), ("all_gather", "weight")),
    3: (("all_gather", "weight"), ("all_gather", "weight"), ("reduce_scatter", "grad")),
}
ALPHA_STEPS = {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1}  # x (k - 1)


def stage_flops(model: ModelSpec, b: int, layout: PlanLayout, stage: int) -> int:
    """Forward + backward (+ recompute) FLOPs of a stage for one micro-batch, whole
    (before the split over tp)."""
    stages = layout.pp * layout.virtual
    n, s, h = b * model.seq, model.seq, model.hidden
    blocks = model.layers // stages
    forward = blocks * n * (24 * h * h + 4 * s * h)
    if stage == stages - 1:
        forward += 2 * n * h * model.vocab
    recompute = {"none": 0, "selective": blocks * 4 * n * s * h}.get(
        layout.ckpt, blocks * n * (24 * h * h + 4 * s * h)
    )
    return 3 * forward + recompute


def axis_links(layout: PlanLayout, hw: Hardware) -> dict[str, str]:
    """'node', 'network' or '-' (degree 1) for each axis."""
    machine = Machine(hw.name, hw.gpus_per_node, 0, 0, 0)
    return links(Layout(layout.dp, layout.pp, layout.tp), machine)


def rank_messages(
    model: ModelSpec, batch: int, policy: DTypePolicy, layout: PlanLayout, rank: int
) -> dict[str, tuple[int, int]]:
    """Per axis: (wire bytes, alpha steps) pipeline rank `rank` sends in a step."""
    stages, t, m = layout.pp * layout.virtual, layout.tp, layout.micro_batches
    b = batch // (layout.dp * m)
    n = b * model.seq
    A = n * model.hidden * policy.activation_bytes
    tp = pp = tp_steps = pp_steps = 0
    for k in rank_stages(layout, rank):
        first, last = k == 0, k == stages - 1
        calls = 4 * model.layers // stages + first + last
        tp += m * calls * ring_wire_bytes("all_reduce", A, t)
        tp += m * 3 * last * ring_wire_bytes("all_reduce", 4 * n, t)
        tp_steps += m * (calls + 3 * last) * 2 * (t - 1)
        sends = (not last) + (not first) if layout.pp > 1 else 0
        pp += m * sends * A
        pp_steps += m * sends
    total = sum(stage_params(model, layout, k) for k in rank_stages(layout, rank))
    d = layout.dp
    size = {"grad": policy.reduce_bytes * total, "weight": policy.weight_bytes * total}
    dp = dp_steps = 0
    for op, what in DP_COLLECTIVES[layout.zero]:
        dp += ring_wire_bytes(op, size[what], d)
        dp_steps += ALPHA_STEPS[op] * (d - 1)
    return dict(tp=(tp, tp_steps), pp=(pp, pp_steps), dp=(dp, dp_steps))


def step_time(
    model: ModelSpec,
    batch: int,
    policy: DTypePolicy,
    layout: PlanLayout,
    hw: Hardware,
) -> tuple[dict[str, float], dict[str, int], int]:
    """(seconds by part with 'total', wire bytes per axis, FLOPs): busiest rank's."""
    t, p, m = layout.tp, layout.pp, layout.micro_batches
    b = batch // (layout.dp * m)
    rate = hw.rate(policy.dtype)
    per_rank = [
        sum(stage_flops(model, b, layout, k) for k in rank_stages(layout, r)) // t
        for r in range(p)
    ]
    unit = max(per_rank) / rate
    seconds = dict(compute=m * unit, bubble=(p - 1) / layout.virtual * unit)
    where = axis_links(layout, hw)
    wire = {axis: 0 for axis in AXES}
    for axis in AXES:
        alpha, beta = hw.link(where[axis])
        worst = 0.0
        for r in range(p):
            nbytes, steps = rank_messages(model, batch, policy, layout, r)[axis]
            worst = max(worst, steps * alpha + nbytes * beta)
            wire[axis] = max(wire[axis], nbytes)
        seconds[axis] = worst
    seconds["total"] = sum(seconds.values())
    return seconds, wire, m * max(per_rank)
