"""A model of the seconds of one training step: compute, the pipeline's bubble, and
each axis's messages under the alpha-beta model (chapter 2). A model with stated
assumptions, not a measurement and not a bound: compute runs at one rate (the
hardware's, for the policy's dtype); every message is a ring collective or a
send costing steps x alpha + bytes x beta on its axis's link; nothing overlaps
(compute, bubble and each axis are added end to end, which makes it long); no
launch, Python, framework, optimizer or elementwise time is counted (which
makes it short). `python -m distcourse.bench plan` sets it beside measured steps.

Notation as in `plan.memory`; R the hardware's rate for the policy's dtype
(`Hardware.rate`), and a link's (alpha, beta) per axis: with TP innermost (the grid
arange(world).view(dp, pp, tp)), tp runs inside a node while t <= GPUs per node,
pp while t p does, dp while d t p does; beyond, on the network
(`parallel.hybrid.recipe.links`).

Compute, integer FLOPs, for stage k and one micro-batch (before the split by t):

    forward     (L // S) n (24 h h + 4 s h)  (+ 2 n h V on the last stage)
                (the six matmuls, 12 h h multiply-adds a token; scores and the
                weighted values, 2 s h each)
    recompute   none 0; selective (L // S) 4 n s h (the attention core); full
                (L // S) n (24 h h + 4 s h) (the blocks' forward again)
    stage       3 forward + recompute           (backward = 2 forward)

Rank r's FLOPs per micro-batch F_r = (sum over its stages) // t; U = max_r F_r / R:

    compute = m U          bubble = (p - 1) / v x U    (0 when p = 1)

Messages per step, for each pipeline rank r: (bytes, alpha steps) per axis. Bytes
are wire bytes (`comm.ledger.ring_wire_bytes`, on a ring of k ranks, 0 if k = 1):
all-reduce 2 (k - 1) T // k, all-gather and reduce-scatter (k - 1) T // k.
A = n h e, the bytes of one activation. Over the rank's stages k:

    tp  calls = 4 (L // S) + [k = 0] + [k last] all-reduces of A (forward g and
        backward f around attention and MLP; the embedding's g; the head's f),
        and on the last stage 3 more of 4 n bytes (the loss's max, sum, target;
        fp32): bytes m (calls x AR(A, t) + 3 [last] x AR(4n, t)), steps
        m (calls + 3 [last]) x 2 (t - 1). (Sequence parallelism swaps each
        all-reduce for an all-gather and a reduce-scatter: the same bytes, the
        same alpha steps.)
    pp  sends = [k not last] + [k not 0] if p > 1, else 0: bytes m sends A,
        steps m sends.
    dp  on the rank's P parameters, q = ceil(P / d) its share (padded: every
        piece of a reduce-scatter or all-gather is q elements): all-reduce of
        the gradients AR(y P, d) = 2 (d - 1) y P // d; a reduce-scatter of them
        RS = (d - 1) y q; an all-gather of the weights AG = (d - 1) w q (each
        rank hands in its q). With m micro-batches (gradient accumulation, or a
        pipeline's), a stage that holds full gradients sums them over the
        micro-batches and reduces once; one that holds only its share must
        reduce-scatter every micro-batch's (DeepSpeed refuses ZeRO-2/3 with a
        pipeline for that reason):
        ZeRO 0  AR                       steps 2 (d - 1)
        ZeRO 1  RS + AG                  steps 2 (d - 1)
        ZeRO 2  m RS + AG                steps (m + 1) (d - 1)
        ZeRO 3  m (AG + AG + RS)         steps 3 m (d - 1)  (forward, backward,
                                         grads: FSDP, reshard_after_forward)
        ZeRO 3  m (AG + RS), reshard False   steps 2 m (d - 1)  (the gathered
                                         weights kept from forward to backward)
        ZeRO-1 is the paper's (section 7.2.1) and DeepSpeed's, 2 Psi as DP: our
        `parallel.zero.FlatZero(stage=1)`. torch's ZeroRedundancyOptimizer runs
        DDP's all-reduce and then broadcasts the parameters (3 Psi): not what
        the planner models.

Seconds per axis: the max over pipeline ranks of steps x alpha + bytes x beta,
with the axis's link's (alpha, beta); `wire` is the max over ranks of the bytes.

With ep or cp above 1 (`plan.axes`): n = b s // cp tokens a micro-batch on a
rank, b = batch / (d ep m); the MoE FLOPs; axes cp and ep (keys only when their
degree is above 1), m x (the rank's blocks) x the layer's bytes and steps; the
gradients of each parameter group of `axes` reduced over its ranks (dp x ep x cp
dense, dp x cp experts), summed into dp. Grid (dp, pp, ep, cp, tp), tp
innermost: cp in a node while t c <= GPUs per node, ep while t c ep does, pp
while t c ep p does, dp while all the GPUs do.

    step = compute + bubble + tp + pp + dp (+ cp + ep) (seconds; a model, not a
    bound: nothing overlaps, and no launch or framework overhead is counted).
"""

from __future__ import annotations

from distcourse.comm.ledger import ring_wire_bytes
from distcourse.plan import axes
from distcourse.plan.hardware import Hardware
from distcourse.plan.memory import rank_groups, rank_stages
from distcourse.plan.spec import DTypePolicy, ModelSpec, PlanLayout

AXES = ("tp", "pp", "dp")
DP_COLLECTIVES = {  # ZeRO stage -> (op, which bytes, once a "step" or a "micro")
    0: (("all_reduce", "grad", "step"),),
    1: (("reduce_scatter", "grad", "step"), ("all_gather", "weight", "step")),
    2: (("reduce_scatter", "grad", "micro"), ("all_gather", "weight", "step")),
    3: (
        ("all_gather", "weight", "micro"),
        ("all_gather", "weight", "micro"),
        ("reduce_scatter", "grad", "micro"),
    ),
}
KEPT = (("all_gather", "weight", "micro"), ("reduce_scatter", "grad", "micro"))
ALPHA_STEPS = {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1}  # x (k - 1)


def handed_in(op: str, what: str, policy: DTypePolicy, total: int, d: int) -> int:
    """Bytes a rank hands to a data-parallel collective over P = `total` elements,
    q = ceil(P / d) its (padded) share: an all-reduce the whole P, a reduce-scatter
    d q (padded to equal pieces), an all-gather its own q."""
    per = policy.reduce_bytes if what == "grad" else policy.weight_bytes
    share = -(-total // d)
    return per * {"all_reduce": total, "reduce_scatter": d * share}.get(op, share)


def dp_calls(layout: PlanLayout) -> list[tuple[str, str, int]]:
    """(op, which bytes, how many times in a step) of the layout's ZeRO stage:
    `DP_COLLECTIVES`, "micro" ones m times; ZeRO-3 without reshard, `KEPT`."""
    m = layout.micro_batches
    calls = KEPT if layout.zero == 3 and not layout.reshard else None
    chosen = calls or DP_COLLECTIVES[layout.zero]
    return [(op, what, m if when == "micro" else 1) for op, what, when in chosen]


def stage_flops(model: ModelSpec, b: int, layout: PlanLayout, stage: int) -> int:
    """Forward + backward (+ recompute) FLOPs of a stage for one micro-batch, whole
    (before the split over tp)."""
    stages = layout.pp * layout.virtual
    n, s, h = b * model.seq // layout.cp, model.seq, model.hidden
    blocks = model.layers // stages
    block = n * (24 * h * h + 4 * s * h) + axes.moe_flops_delta(model, n)
    forward = blocks * block
    if stage == stages - 1:
        forward += 2 * n * h * model.vocab
    recompute = {"none": 0, "selective": blocks * 4 * n * s * h}.get(
        layout.ckpt, blocks * block
    )
    return 3 * forward + recompute


def layout_axes(layout: PlanLayout) -> tuple[str, ...]:
    """tp, pp, dp, and cp, ep where their degree is above 1."""
    return AXES + tuple(a for a in ("cp", "ep") if getattr(layout, a) > 1)


def axis_links(layout: PlanLayout, hw: Hardware) -> dict[str, str]:
    """'node', 'network' or '-' (degree 1) for each axis (grid dp, pp, ep, cp, tp;
    as `hybrid.recipe.links` for dp, pp, tp)."""
    span, where = 1, {}
    for axis in ("tp", "cp", "ep", "pp", "dp"):
        span *= getattr(layout, axis)
        link = "node" if span <= hw.gpus_per_node else "network"
        where[axis] = link if getattr(layout, axis) > 1 else "-"
    return {axis: where[axis] for axis in layout_axes(layout)}


def rank_messages(
    model: ModelSpec, batch: int, policy: DTypePolicy, layout: PlanLayout, rank: int
) -> dict[str, tuple[int, int]]:
    """Per axis: (wire bytes, alpha steps) pipeline rank `rank` sends in a step."""
    stages, t, m = layout.pp * layout.virtual, layout.tp, layout.micro_batches
    b = batch // (layout.shares * m)
    n, e = b * model.seq // layout.cp, policy.activation_bytes
    A = n * model.hidden * e
    tp = pp = tp_steps = pp_steps = 0
    out = {a: (0, 0) for a in layout_axes(layout)}
    layer = axes.layer_messages(model, layout, n, e)
    for k in rank_stages(layout, rank):
        for axis, (nbytes, steps) in layer.items():
            times = m * model.layers // stages
            out[axis] = (out[axis][0] + times * nbytes, out[axis][1] + times * steps)
        first, last = k == 0, k == stages - 1
        calls = 4 * model.layers // stages + first + last
        tp += m * calls * ring_wire_bytes("all_reduce", A, t)
        tp += m * 3 * last * ring_wire_bytes("all_reduce", 4 * n, t)
        tp_steps += m * (calls + 3 * last) * 2 * (t - 1)
        sends = (not last) + (not first) if layout.pp > 1 else 0
        pp += m * sends * A
        pp_steps += m * sends
    dp = dp_steps = 0
    for d, (total, _) in rank_groups(model, layout, rank).items():
        for op, what, times in dp_calls(layout):
            nbytes = ring_wire_bytes(op, handed_in(op, what, policy, total, d), d)
            dp += times * nbytes
            dp_steps += times * ALPHA_STEPS[op] * (d - 1)
    out.update(tp=(tp, tp_steps), pp=(pp, pp_steps), dp=(dp, dp_steps))
    return out


def step_time(
    model: ModelSpec,
    batch: int,
    policy: DTypePolicy,
    layout: PlanLayout,
    hw: Hardware,
) -> tuple[dict[str, float], dict[str, int], int]:
    """(seconds by part with 'total', wire bytes per axis, FLOPs): busiest rank's."""
    t, p, m = layout.tp, layout.pp, layout.micro_batches
    b = batch // (layout.shares * m)
    rate = hw.rate(policy.dtype)
    per_rank = [
        sum(stage_flops(model, b, layout, k) for k in rank_stages(layout, r)) // t
        for r in range(p)
    ]
    unit = max(per_rank) / rate
    seconds = dict(compute=m * unit, bubble=(p - 1) / layout.virtual * unit)
    where = axis_links(layout, hw)
    wire = {axis: 0 for axis in layout_axes(layout)}
    sent = [rank_messages(model, batch, policy, layout, r) for r in range(p)]
    for axis in wire:
        alpha, beta = hw.link(where[axis])
        worst = 0.0
        for r in range(p):
            nbytes, steps = sent[r][axis]
            worst = max(worst, steps * alpha + nbytes * beta)
            wire[axis] = max(wire[axis], nbytes)
        seconds[axis] = worst
    seconds["total"] = sum(seconds.values())
    return seconds, wire, m * max(per_rank)
