"""A model of the seconds of one training step: matmuls at the reached rate of their
dtype, element-wise work as bytes over memory bandwidth (a roofline term), the
optimizer's step, the pipeline's bubble, and each axis's messages under the
alpha-beta model (chapter 2), data-parallel ones hidden behind the compute they
overlap. A model with stated assumptions, not a measurement and not a bound: every
message is a ring collective or a send costing steps x alpha + bytes x beta on
its axis's link; no launch, Python or framework time is counted (a small model's
eager step is partly launch-bound: on one H200 a 135M TinyGPT's bf16 step took
1.4 x this model's, tests/data/gpu_measurements.json). `python -m
distcourse.bench plan` sets it beside measured steps.

Notation as in `plan.memory`; R the hardware's reached rate for the policy's
matmul dtype (`Hardware.rate`: fp32, or bf16 for bf16 and amp-bf16), B the bytes/s
element-wise kernels reach (`Hardware.streamed`), and a link's (alpha, beta) per
axis: with TP innermost (the grid arange(world).view(dp, pp, tp)), tp runs inside
a node while t <= GPUs per node, pp while t p does, dp while d t p does; beyond,
on the network (`parallel.hybrid.recipe.links`).

Work per micro-batch (`plan.work`): rank r's FLOPs F_r = (sum over its stages of
`stage_flops`) // t, its bytes M_r (`stage_traffic`), so its seconds
U_r = F_r / R + M_r / B, of which the forward f_r (a third of what does not
recompute) and the backward b_r = U_r - f_r; the busiest rank has the largest U.
Its stepped elements (`plan.memory`: P, or the ZeRO share q) move
`optimizer_traffic` bytes:

    compute = m F / R      memory = m M / B      optimizer = traffic / B
    bubble = (p - 1) / v x U    (0 when p = 1)

Messages per step, for each pipeline rank r: (bytes, alpha steps) per axis. Bytes
are wire bytes (`comm.ledger.ring_wire_bytes`, on a ring of k ranks, 0 if k = 1):
all-reduce 2 (k - 1) T // k, all-gather and reduce-scatter (k - 1) T // k.
A = n h u the bytes of a matmul's output (tensor parallelism's messages), R_p =
n h r of the residual stream (the pipeline's). Over the rank's stages k:

    tp  calls = 4 (L // S) + [k = 0] + [k last] all-reduces of A (forward g and
        backward f around attention and MLP; the embedding's g; the head's f),
        and on the last stage 3 more of 4 n bytes (the loss's max, sum, target;
        fp32): bytes m (calls x AR(A, t) + 3 [last] x AR(4n, t)), steps
        m (calls + 3 [last]) x 2 (t - 1). (Sequence parallelism swaps each
        all-reduce for an all-gather and a reduce-scatter: the same bytes, the
        same alpha steps.)
    pp  sends = [k not last] + [k not 0] if p > 1, else 0: bytes m sends R_p,
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

Seconds per axis (`messages`): the max over pipeline ranks of steps x alpha +
bytes x beta, with the axis's link's (alpha, beta); `wire` is the max over ranks
of the bytes.

Overlap. Data-parallel collectives run beside the compute of the pass that
produces or needs them (DDP's buckets during backward, FSDP's prefetched
all-gathers and its reduce-scatters, as chapter 10 measures the rule
T >= (d - 1) / d x C / W): each collective hides behind one pass (`DP_COLLECTIVES`:
"forward", "backward", or "none": ZeRO-1 and ZeRO-2's all-gather of the updated
weights runs after the step). With M_x the seconds of the per-micro-batch
collectives that hide behind pass x (f_r or b_r), S_x those of the once-a-step
ones (at the last micro-batch) and E the unhidden ones, the exposed seconds of
rank r are

    (m - 1) (max(0, M_f - f_r) + max(0, M_b - b_r))
    + max(0, M_f + S_f - f_r) + max(0, M_b + S_b - b_r) + E

and time.dp is the max over ranks. The first unit's all-gather and the last
bucket's reduction, which nothing can hide, are not counted. Tensor-parallel,
pipeline, context- and expert-parallel messages are not overlapped (they sit
between the ops that need them).

With ep or cp above 1 (`plan.axes`): n = b s // cp tokens a micro-batch on a
rank, b = batch / (d ep m); the MoE FLOPs; axes cp and ep (keys only when their
degree is above 1), m x (the rank's blocks) x the layer's bytes and steps; the
gradients of each parameter group of `axes` reduced over its ranks (dp x ep x cp
dense, dp x cp experts), summed into dp. Grid (dp, pp, ep, cp, tp), tp
innermost: cp in a node while t c <= GPUs per node, ep while t c ep does, pp
while t c ep p does, dp while all the GPUs do.

    step = compute + memory + optimizer + bubble + tp + pp + dp (exposed)
           (+ cp + ep)
"""

from __future__ import annotations

from distcourse.comm.ledger import ring_wire_bytes
from distcourse.parallel.tensor.dtypes import Precision
from distcourse.plan import axes
from distcourse.plan.hardware import Hardware
from distcourse.plan.memory import rank_groups, rank_stages, stepped_elements
from distcourse.plan.spec import DTypePolicy, ModelSpec, PlanLayout
from distcourse.plan.work import optimizer_traffic, stage_flops, stage_traffic

AXES = ("tp", "pp", "dp")
PARTS = ("compute", "memory", "optimizer", "bubble")
# ZeRO stage -> (op, which bytes, once a "step" or every "micro"-batch, the pass
# it hides behind)
DP_COLLECTIVES = {
    0: (("all_reduce", "grad", "step", "backward"),),
    1: (
        ("reduce_scatter", "grad", "step", "backward"),
        ("all_gather", "weight", "step", "none"),
    ),
    2: (
        ("reduce_scatter", "grad", "micro", "backward"),
        ("all_gather", "weight", "step", "none"),
    ),
    3: (
        ("all_gather", "weight", "micro", "forward"),
        ("all_gather", "weight", "micro", "backward"),
        ("reduce_scatter", "grad", "micro", "backward"),
    ),
}
KEPT = (
    ("all_gather", "weight", "micro", "forward"),
    ("reduce_scatter", "grad", "micro", "backward"),
)
ALPHA_STEPS = {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1}  # x (k - 1)


def handed_in(op: str, what: str, policy: DTypePolicy, total: int, d: int) -> int:
    """Bytes a rank hands to a data-parallel collective over P = `total` elements,
    q = ceil(P / d) its (padded) share: an all-reduce the whole P, a reduce-scatter
    d q (padded to equal pieces), an all-gather its own q."""
    per = policy.reduce_bytes if what == "grad" else policy.weight_bytes
    share = -(-total // d)
    return per * {"all_reduce": total, "reduce_scatter": d * share}.get(op, share)


def dp_calls(layout: PlanLayout) -> list[tuple[str, str, int, str]]:
    """(op, which bytes, how many times in a step, the pass it hides behind) of
    the layout's ZeRO stage: `DP_COLLECTIVES`, "micro" ones m times; ZeRO-3
    without reshard, `KEPT`."""
    m = layout.micro_batches
    calls = KEPT if layout.zero == 3 and not layout.reshard else None
    chosen = calls or DP_COLLECTIVES[layout.zero]
    return [
        (op, what, m if when == "micro" else 1, hides)
        for op, what, when, hides in chosen
    ]


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
    model: ModelSpec,
    batch: int,
    policy: DTypePolicy,
    layout: PlanLayout,
    rank: int,
    prec: Precision | None = None,
) -> dict[str, tuple[int, int]]:
    """Per axis: (wire bytes, alpha steps) pipeline rank `rank` sends in a step
    (the policy on a GPU unless `prec` says otherwise)."""
    prec = prec or Precision(policy.dtype)
    stages, t, m = layout.pp * layout.virtual, layout.tp, layout.micro_batches
    b = batch // (layout.shares * m)
    n = b * model.seq // layout.cp
    A = n * model.hidden * prec.nbytes("value")
    sent = n * model.hidden * prec.nbytes("residual")
    tp = pp = tp_steps = pp_steps = 0
    out = {a: (0, 0) for a in layout_axes(layout)}
    layer = axes.layer_messages(model, layout, n, prec)
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
        pp += m * sends * sent
        pp_steps += m * sends
    dp = dp_steps = 0
    for d, (total, _) in rank_groups(model, layout, rank).items():
        for op, what, times, _ in dp_calls(layout):
            nbytes = ring_wire_bytes(op, handed_in(op, what, policy, total, d), d)
            dp += times * nbytes
            dp_steps += times * ALPHA_STEPS[op] * (d - 1)
    out.update(tp=(tp, tp_steps), pp=(pp, pp_steps), dp=(dp, dp_steps))
    return out


def exposed_dp(
    model: ModelSpec,
    policy: DTypePolicy,
    layout: PlanLayout,
    rank: int,
    hw: Hardware,
    passes: tuple[float, float],
) -> float:
    """Seconds of rank `rank`'s data-parallel messages that its compute does not
    hide, its (forward, backward) seconds a micro-batch `passes` (docstring)."""
    alpha, beta = hw.link(axis_links(layout, hw)["dp"])
    hidden = {("micro", "forward"): 0.0, ("micro", "backward"): 0.0}
    hidden.update({("step", "forward"): 0.0, ("step", "backward"): 0.0})
    unhidden, m = 0.0, layout.micro_batches
    for d, (total, _) in rank_groups(model, layout, rank).items():
        for op, what, times, hides in dp_calls(layout):
            nbytes = ring_wire_bytes(op, handed_in(op, what, policy, total, d), d)
            seconds = ALPHA_STEPS[op] * (d - 1) * alpha + nbytes * beta
            if hides == "none":
                unhidden += times * seconds
            else:
                hidden[("micro" if times > 1 else "step", hides)] += seconds
    out = unhidden
    for x, pass_seconds in zip(("forward", "backward"), passes, strict=True):
        micro, step = hidden[("micro", x)], hidden[("step", x)]
        out += (m - 1) * max(0.0, micro - pass_seconds)
        out += max(0.0, micro + step - pass_seconds)
    return out


def rank_work(
    model: ModelSpec,
    b: int,
    layout: PlanLayout,
    prec: Precision,
    rank: int,
) -> tuple[int, int, int, int]:
    """(FLOPs, bytes, forward FLOPs, forward bytes) of a micro-batch on pipeline
    rank `rank`, after the split over tp (the forward without recompute)."""
    flops = traffic = fwd_flops = fwd_traffic = 0
    for k in rank_stages(layout, rank):
        flops += stage_flops(model, b, layout, k)
        traffic += stage_traffic(model, b, layout, prec, k)
        fwd_flops += stage_flops(model, b, layout, k, "none") // 3
        fwd_traffic += stage_traffic(model, b, layout, prec, k, "none") // 3
    t = layout.tp
    return flops // t, traffic, fwd_flops // t, fwd_traffic


def step_time(
    model: ModelSpec,
    batch: int,
    policy: DTypePolicy,
    layout: PlanLayout,
    hw: Hardware,
) -> tuple[dict[str, float], dict[str, float], dict[str, int], int]:
    """(seconds by part with 'total', each axis's message seconds before overlap,
    wire bytes per axis, FLOPs): the busiest rank's (module docstring)."""
    p, m, prec = layout.pp, layout.micro_batches, hw.precision(policy)
    b = batch // (layout.shares * m)
    rate, streamed = hw.rate(policy.matmul_dtype), hw.streamed
    work = [rank_work(model, b, layout, prec, r) for r in range(p)]
    units = [f / rate + bytes_ / streamed for f, bytes_, _, _ in work]
    busiest = max(range(p), key=lambda r: units[r])
    flops, traffic = work[busiest][0], work[busiest][1]
    seconds = dict(compute=m * flops / rate, memory=m * traffic / streamed)
    stepped = max(stepped_elements(model, layout, r) for r in range(p))
    seconds["optimizer"] = optimizer_traffic(policy, stepped) / streamed
    seconds["bubble"] = (p - 1) / layout.virtual * units[busiest]
    where = axis_links(layout, hw)
    wire = {axis: 0 for axis in layout_axes(layout)}
    messages = {axis: 0.0 for axis in layout_axes(layout)}
    sent = [rank_messages(model, batch, policy, layout, r, prec) for r in range(p)]
    for axis in wire:
        alpha, beta = hw.link(where[axis])
        for r in range(p):
            nbytes, steps = sent[r][axis]
            messages[axis] = max(messages[axis], steps * alpha + nbytes * beta)
            wire[axis] = max(wire[axis], nbytes)
        seconds[axis] = messages[axis]
    exposed = 0.0
    for r, (_, _, fwd_flops, fwd_traffic) in enumerate(work):
        forward = fwd_flops / rate + fwd_traffic / streamed
        passes = (forward, units[r] - forward)
        exposed = max(exposed, exposed_dp(model, policy, layout, r, hw, passes))
    seconds["dp"] = exposed
    seconds["total"] = sum(seconds.values())
    return seconds, messages, wire, m * flops
