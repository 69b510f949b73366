"""Bytes one rank holds during a step, by kind, and the step's peak: the largest of
three moments at which the kinds coexist.

Notation: L blocks of width h, a heads, seq tokens s, vocabulary V; degrees d (dp),
t (tp), p (pp), v (stages per rank, interleaved); m micro-batches of
b = batch / (d m) sequences, n = b s tokens each; w, g, o the policy's bytes per
weight, gradient and optimizer element (spec.DTypePolicy), y per gradient element
on the wire (the reduce dtype), c per step counter (AdamW 4). Activation tensors
weigh what the policy gives them on the hardware's device
(`parallel.tensor.dtypes.Precision`, `Hardware.precision`): r the residual
stream's, z a norm statistic's, i a Linear's kept input's, u a matmul output's,
k_w a kept weight cast's, l the kept log-probabilities' and x the loss region's
(per logit). Every count is an integer; `//` is floor division,
ceil(i / j) = -(-i // j).

Kinds (`KINDS`): parameters, gradients, optimizer, activations, loss, temporaries,
buffers, workspace.

Model state. The pipeline has S = p v stages, stage k on rank k % p; rank r holds
stages r, r + p, ..., r + (v - 1) p. Stage k has L // S blocks; its parameters
(`hybrid.cost.parameters_held` for S stages) and parameter tensors:

    block    4h + (4 h h // t + 3h // t + h) + ((4 h h + 4h) // t + 4 h h // t + h)
    stage k  (L // S) x block, + V h // t + s h if k = 0, + 2h + V h // t if last
    tensors  16 (L // S), + 2 if k = 0, + 3 if last

With P elements and T tensors on the rank (summed over its stages), its ZeRO
share q = ceil(P / d) and T_z = T for ZeRO 0 and 3, ceil(T / d) for 1 and 2 (the
tensors it steps):

    parameters  w x (q if zero = 3 else P)
    gradients   g x (q if zero >= 2 else P)
    optimizer   o x (P if zero = 0 else q) + c x T_z

(fp32 AdamW: 4 + 4 + 8 = 16 bytes per parameter, the ZeRO paper's DP 16P,
ZeRO-1 4P + 4P + 8P/d, ZeRO-2 4P + 12P/d, ZeRO-3 16P/d; `parallel.zero.memory.
formula`, which takes the package's exact, uneven shares.)

Buffers, persistent (alive at every moment):

    buckets    y x P if d > 1 and zero <= 1 and not bucket_view, else 0 (DDP's
               flat gradient buckets in the reduce dtype; with bucket_view the
               gradients are views into them)
    accum      4 x (q if zero >= 2 else P), if m > 1 and g < 4 (a bf16 policy):
               the fp32 gradient accumulation buffer the micro-batches' gradients
               are summed in (bf16 would round each sum to 8 bits). ZeRO-2/3
               reduce-scatter every micro-batch's gradients (`plan.timing`) and
               sum only their share. Apart from the buckets, with bucket_view or
               not: bucket_view makes .grad (g bytes) a view of a bucket; the
               fp32 sum is a third array. So a bf16 rank under DP with m > 1
               holds 2 + 2 + 12 + 4 = 20 bytes a parameter (the Ultra-Scale
               Playbook's column), + y without bucket_view.

and transient (alive in forward and backward, not at the optimizer's step):

    ZeRO-3     2 x w x (block + R), if zero = 3 and d > 1: one block all-gathered
               and its gradient before the reduce-scatter, beside the root unit's
               R = P - (the rank's blocks) x block elements (embeddings on the
               first stage, final norm and head on the last: FSDP wraps each
               block and the root, whose parameters stay gathered from the first
               block's forward to the embedding's gradient, the last of
               backward) and its gradient; with reshard False, w x P instead
               (every parameter stays gathered from forward to backward)
    ckpt       block_none (below), if ckpt is not "none" (one block's
               activations recomputed in backward, on top of what is held)

Activations, what autograd keeps for backward (saved-tensor hooks), for one
micro-batch of b sequences on stage k; N = n // t with sp, n without; the kernel
term is what torch's attention kernel keeps for this device, matmul dtype and
head size h / a (`distcourse.sdpa`):

    block_none       `parallel.tensor.memory.block_activation_bytes`:
                     N (r h + 2 z) x 2                     (ln1, ln2)
                     + n (k i h + 4 u h // t) + kernel     (attention: input, k
                       copies under autocast; q, k, v, output; the kernel's own)
                     + n (i h + 8 u h // t)                (MLP)
                     + k_w 12 h h // t                     (autocast's weight casts)
    block_selective  block_none - kernel (the attention core recomputed)
    block_full       n h r // t with sp, n h r without (the block's input)
    stage k          (L // S) x block_<ckpt>
                     + if k = 0: 8 n + 8 s (int64 token ids, positions), or
                       9 n + 8 s when t > 1 (+ a 1-byte mask of ids not owned)
                     + if k is last: N (r h + 2 z) + n i h + k_w V h // t (final
                       norm, head input and weight cast) + l n V // t + 8 n + 4
                       (log-probabilities, int64 targets, the loss's weight) +
                       n when t > 1 (a 1-byte mask of targets not owned); with
                       t > 1 the vocabulary-parallel loss keeps its softmax in
                       the logits' dtype: u n V // t instead
                     + if p > 1: n h r (the stage output the pipeline keeps), or
                       4 on the last stage (its loss)

Peak over the step on pipeline rank r, with U_k that micro-batch count:

    p = 1            U_r (gradient accumulation: one micro-batch at a time)
    GPipe            m x U_r
    1F1B             min(m, p - r) x U_r
    interleaved      a walk over the rank's actions (`in_flight_bytes`): with
                     g = m // max(1, m // p) micro-batches a round, T = m v,
                     warm = T if m = p else min(2 (p - r - 1) + (v - 1) g, T);
                     for f = 0 .. T - 1: held += U of chunk (f // g) % v, peak =
                     max(peak, held); then if f >= warm: held -= U of chunk
                     v - 1 - ((f - warm) // g) % v (chunk j is stage r + j p)

Loss (last stage only), the loss region at its worst beyond what it keeps:
x n V // t (the logits while the log-softmax is written, then in backward the
gradients of the log-probabilities and of the logits; `dtypes`' table); with t > 1
the vocabulary-parallel loss's max(8 + u, 3 u) n V // t (its one-hot in int64 and
in the logits' dtype, then softmax - onehot and its product with the gradient).

Temporaries, a block's backward at its largest: n (4 u h // t + 2 r h) (the
gradients into and out of GELU, 8 u h // t, less the GELU output the projection's
backward has freed by then; and the residual stream's gradient with the branch's
before they are summed). Attention's backward comes to the same: the output's
gradient and dq, dk, dv beside what the kernel keeps.

Optimizer temporaries, at the step: "adamw-fused" and "sgd" none; "adamw" on a GPU
(foreach) 4 x the elements it steps (`_foreach_sqrt` of every second moment at
once); on a CPU (one tensor at a time) 8 x the largest tensor it steps (a square
root and its quotient alive together).

Workspace: the hardware's (`Hardware.workspace`, cuBLAS's).

Moments (`MOMENTS`), each the sum of the kinds alive then:

    loss      (last stage) parameters + optimizer + workspace + buffers +
              gradients held + activations + loss
    backward  parameters + optimizer + workspace + buffers + gradients held +
              activations + temporaries
    step      parameters + optimizer + workspace + persistent buffers +
              gradients + optimizer temporaries

where the gradients held at the start of backward are all of them if m > 1
(the earlier micro-batches' sums) or they live in DDP's buckets (bucket_view
under ZeRO 0-1 with d > 1), else none (the step before zeroed them to None).
Both backward moments count every activation in flight: a bound, as backward
frees some before its temporaries peak. The rank's total is the largest moment;
`memory` reports each kind at its own largest, `peak` the kinds at the largest
moment (they add up to the total). Measured on one H200 (TinyGPT 12 x 768,
sequence 1024, vocabulary 32000, batch 8, fp32, fused AdamW): the peak came at
the loss's backward, 9.72 GB, with no gradient yet.

Reserve, outside torch's allocator (so outside the total; `Prediction.fits` keeps
it free): the hardware's CUDA context + its NCCL buffers x the process groups of
more than one rank (one per axis of degree above 1).

Experts (ep) and context parallelism (cp), with b = batch / (d ep m) and every
activation that of seq s / cp: `plan.axes` (its parameter groups replace P, q
and T above, summed over the groups; its buffers join the transient buffers).

The fullest rank (largest total; the first of equals) is `memory`; every
pipeline rank, first to last, `by_rank` (any dp and tp coordinate holds the same).
"""

from __future__ import annotations

import functools

from distcourse.parallel.hybrid.cost import parameters_held
from distcourse.parallel.hybrid.layout import Layout
from distcourse.parallel.tensor.dtypes import Precision
from distcourse.parallel.tensor.memory import block_activation_bytes
from distcourse.plan import axes
from distcourse.plan.hardware import GPUS, Hardware
from distcourse.plan.spec import DTypePolicy, ModelSpec, PlanLayout

KINDS = (
    "parameters",
    "gradients",
    "optimizer",
    "activations",
    "loss",
    "temporaries",
    "buffers",
    "workspace",
)
MOMENTS = ("loss", "backward", "step")
TENSORS_PER_BLOCK = 16  # ln1 (2), q k v proj (8), ln2 (2), fc and proj (4)


def ceil_div(x: int, y: int) -> int:
    return -(-x // y)


def block_params(h: int, t: int) -> int:
    """One block's parameters on a rank of tp = t, as hybrid.cost counts them."""
    attention = 4 * h * h // t + 3 * h // t + h
    mlp = (4 * h * h + 4 * h) // t + 4 * h * h // t + h
    return 4 * h + attention + mlp


@functools.lru_cache(maxsize=4096)
def stage_params(model: ModelSpec, layout: PlanLayout, stage: int) -> int:
    """Parameters of pipeline stage `stage` (of pp x virtual) on a rank of tp."""
    stages = layout.pp * layout.virtual
    return parameters_held(Layout(1, stages, layout.tp), model.config(), stage)


def stage_tensors(model: ModelSpec, layout: PlanLayout, stage: int) -> int:
    """Parameter tensors of a stage: 16 per block, +2 first (embeddings), +3 last."""
    stages = layout.pp * layout.virtual
    count = TENSORS_PER_BLOCK * model.layers // stages
    return count + 2 * (stage == 0) + 3 * (stage == stages - 1)


def rank_stages(layout: PlanLayout, rank: int) -> list[int]:
    """Stages on pipeline rank `rank`: rank, rank + pp, ... (virtual of them)."""
    return [rank + k * layout.pp for k in range(layout.virtual)]


def model_state(
    policy: DTypePolicy, zero: int, total: int, share: int, tensors: int
) -> dict[str, int]:
    """Parameters, gradients, optimizer bytes for `total` elements on the rank, of
    which it owns `share` under ZeRO, stepping `tensors` tensors."""
    return dict(
        parameters=policy.weight_bytes * (share if zero == 3 else total),
        gradients=policy.grad_bytes * (share if zero >= 2 else total),
        optimizer=policy.optimizer_bytes * (total if zero == 0 else share)
        + policy.step_bytes * tensors,
    )


def block_bytes(
    model: ModelSpec, b: int, layout: PlanLayout, prec: Precision, ckpt: str
) -> int:
    """One block's activations for a micro-batch of b sequences (s / cp tokens)."""
    s, h, a, t = model.seq // layout.cp, model.hidden, model.heads, layout.tp
    if ckpt == "full":
        return b * s * h * prec.nbytes("residual") // (t if layout.sp else 1)
    counts = block_activation_bytes(
        b, s, h, a, t, sequence_parallel=layout.sp, precision=prec
    )
    kernel = prec.attention(b, a // t, s, h // a)
    moe = axes.moe_activation_delta(model, b * s, t, prec)
    return sum(counts.values()) + moe - (kernel if ckpt == "selective" else 0)


def stage_activation_bytes(
    model: ModelSpec, b: int, layout: PlanLayout, prec: Precision, stage: int
) -> int:
    """What a stage keeps for backward for one micro-batch of b sequences."""
    stages = layout.pp * layout.virtual
    s, h, V, t = model.seq // layout.cp, model.hidden, model.vocab, layout.tp
    n, r = b * s, prec.nbytes("residual")
    held = model.layers // stages * block_bytes(model, b, layout, prec, layout.ckpt)
    if stage == 0:
        held += (9 if t > 1 else 8) * n + 8 * s
    last = stage == stages - 1
    if last:
        norm_tokens = n // t if layout.sp else n
        held += norm_tokens * (h * r + 2 * prec.nbytes("stats"))
        held += n * h * prec.nbytes("input") + prec.nbytes("weight_copy") * V * h // t
        kept = prec.nbytes("value" if t > 1 else "log_probs")
        held += kept * n * V // t + 8 * n + 4 + (n if t > 1 else 0)
    if layout.pp > 1:  # the pipeline keeps each stage's output until its backward
        held += 4 if last else n * h * r
    return held


def loss_bytes(model: ModelSpec, b: int, layout: PlanLayout, prec: Precision) -> int:
    """The loss region at its worst beyond what the loss keeps, for a micro-batch
    of b sequences on the last stage (module docstring)."""
    n, t, u = b * model.seq // layout.cp, layout.tp, prec.nbytes("value")
    per = max(8 + u, 3 * u) if t > 1 else prec.nbytes("loss_extra")
    return per * n * model.vocab // t


def temporary_bytes(
    model: ModelSpec, b: int, layout: PlanLayout, prec: Precision
) -> int:
    """A block's backward at its largest, beyond what it keeps: the gradients into
    and out of GELU less the output freed before them, the residual stream's
    gradient and the branch's."""
    n, h, t = b * model.seq // layout.cp, model.hidden, layout.tp
    return n * (4 * prec.nbytes("value") * h // t + 2 * prec.nbytes("residual") * h)


def optimizer_temporaries(
    policy: DTypePolicy, prec: Precision, stepped: int, largest: int
) -> int:
    """What the optimizer's step allocates and frees: `stepped` elements, the
    largest tensor of `largest` (module docstring)."""
    if policy.optimizer != "adamw":
        return 0
    return 4 * stepped if prec.device != "cpu" else 8 * min(largest, stepped)


def largest_tensor(model: ModelSpec, layout: PlanLayout, rank: int) -> int:
    """Elements of the largest parameter tensor on pipeline rank `rank`: an
    embedding or the head (V h / t) where it holds one, else an MLP matrix."""
    h, t, stages = model.hidden, layout.tp, layout.pp * layout.virtual
    ends = {0, stages - 1} & set(rank_stages(layout, rank))
    return max(4 * h * h // t, model.vocab * h // t if ends else 0)


def in_flight(layout: PlanLayout, rank: int) -> int:
    """Micro-batches (GPipe, 1F1B) or stage units (interleaved) held at the peak."""
    p, m, v = layout.pp, layout.micro_batches, layout.virtual
    if p == 1:  # gradient accumulation: one micro-batch at a time
        return 1
    if layout.schedule == "gpipe":
        return m
    if layout.schedule == "1f1b":
        return min(m, p - rank)
    total = m * v
    if m == p:
        return total
    g = m // max(1, m // p)
    return min(2 * (p - rank - 1) + (v - 1) * g + 1, total)


def in_flight_bytes(units: list[int], layout: PlanLayout, rank: int) -> int:
    """Peak bytes held on `rank` under interleaved 1F1B, walking its actions.

    `units[k]` is the bytes of the rank's k-th stage (chunk k) per micro-batch.
    The rank runs its F units f = 0 .. m v - 1 on chunk (f // g) % v, its B units
    on chunk v - 1 - (f // g) % v (g micro-batches per round, as
    `parallel.pipeline.schedules.interleaved`): `warm` forwards, then F, B
    alternating, then the rest of the Bs. The peak follows a forward."""
    p, m, v = layout.pp, layout.micro_batches, layout.virtual
    total, g = m * v, m // max(1, m // p)
    warm = total if m == p else min(2 * (p - rank - 1) + (v - 1) * g, total)
    now = peak = 0
    for f in range(total):
        now += units[(f // g) % v]
        peak = max(peak, now)
        if f >= warm:  # one backward after each steady-state forward
            now -= units[v - 1 - ((f - warm) // g) % v]
    return peak


@functools.lru_cache(maxsize=4096)
def rank_groups(
    model: ModelSpec, layout: PlanLayout, rank: int
) -> dict[int, tuple[int, int]]:
    """{group size: (elements, tensors)} on pipeline rank `rank` (`axes`);
    remembered (its inputs are frozen): do not change the dict it returns."""
    mine = rank_stages(layout, rank)
    total = sum(stage_params(model, layout, k) for k in mine)
    tensors = sum(stage_tensors(model, layout, k) for k in mine)
    blocks = len(mine) * model.layers // (layout.pp * layout.virtual)
    return axes.param_groups(model, layout, total, tensors, blocks)


def bucket_bytes(policy: DTypePolicy, layout: PlanLayout, total: int) -> int:
    """DDP's flat gradient buckets in the reduce dtype, r x P (P: the elements
    reduced over more than one rank), when dp x ep x cp > 1 without ZeRO-2/3; 0
    when the gradients are views into them (bucket_view)."""
    reduced = layout.dp * layout.ep * layout.cp > 1
    if reduced and layout.zero <= 1 and not layout.bucket_view:
        return policy.reduce_bytes * total
    return 0


def accumulation_bytes(
    policy: DTypePolicy, layout: PlanLayout, groups: dict[int, tuple[int, int]]
) -> int:
    """The fp32 gradient accumulation buffer: 4 bytes a gradient element held (P,
    or the share q under ZeRO-2/3), when m > 1 micro-batches sum gradients of a
    narrower dtype; 0 otherwise (fp32 gradients accumulate in place)."""
    if layout.micro_batches == 1 or policy.grad_bytes >= 4:
        return 0
    held = (ceil_div(n, d) if layout.zero >= 2 else n for d, (n, _) in groups.items())
    return 4 * sum(held)


def stepped_elements(model: ModelSpec, layout: PlanLayout, rank: int) -> int:
    """Elements the optimizer of pipeline rank `rank` steps: all it holds under
    ZeRO 0, its share q of each group otherwise."""
    groups = rank_groups(model, layout, rank).items()
    return sum(n if layout.zero == 0 else ceil_div(n, d) for d, (n, _) in groups)


def transient_buffers(
    model: ModelSpec,
    b: int,
    prec: Precision,
    policy: DTypePolicy,
    layout: PlanLayout,
    groups: dict[int, tuple[int, int]],
    blocks: int,
) -> int:
    """Gathered units or parameters (ZeRO-3), a recomputed block (ckpt), dispatch
    rows and ring messages (`axes.axis_buffers`), on a rank of `blocks` blocks:
    alive in forward and backward."""
    reduced = sum(n for d, (n, _) in groups.items() if d > 1)
    out = 0
    if layout.zero == 3 and max(groups) > 1 and not layout.reshard:
        out += policy.weight_bytes * reduced
    elif layout.zero == 3 and max(groups) > 1:
        block = block_params(model.hidden, layout.tp) + axes.block_delta(model, layout)
        root = sum(n for n, _ in groups.values()) - blocks * block
        out += 2 * policy.weight_bytes * (block + root)
    if layout.ckpt != "none":
        out += block_bytes(model, b, layout, prec, "none")
    return out + axes.axis_buffers(model, layout, b * model.seq // layout.cp, prec)


def rank_moments(
    model: ModelSpec,
    batch: int,
    policy: DTypePolicy,
    layout: PlanLayout,
    rank: int,
    hw: Hardware,
) -> dict[str, dict[str, int]]:
    """{moment: {kind: bytes}} on pipeline rank `rank` (any dp and tp coordinate):
    the kinds alive at each of MOMENTS (the loss's only on the last stage)."""
    prec, mine = hw.precision(policy), rank_stages(layout, rank)
    zero, state = layout.zero, dict(parameters=0, gradients=0, optimizer=0)
    groups = rank_groups(model, layout, rank)
    for d, (elements, tensors) in groups.items():
        steps = tensors if zero in (0, 3) else ceil_div(tensors, d)
        held = model_state(policy, zero, elements, ceil_div(elements, d), steps)
        state = {k: state[k] + held[k] for k in state}
    b = batch // (layout.shares * layout.micro_batches)
    units = [stage_activation_bytes(model, b, layout, prec, k) for k in mine]
    if layout.virtual == 1 or layout.pp == 1:
        activations = in_flight(layout, rank) * units[0]
    else:
        activations = in_flight_bytes(units, layout, rank)
    blocks = len(mine) * model.layers // (layout.pp * layout.virtual)
    reduced = sum(n for d, (n, _) in groups.items() if d > 1)
    persistent = bucket_bytes(policy, layout, reduced)
    persistent += accumulation_bytes(policy, layout, groups)
    transient = transient_buffers(model, b, prec, policy, layout, groups, blocks)
    viewed = layout.bucket_view and zero <= 1 and reduced > 0
    early = state["gradients"] if layout.micro_batches > 1 or viewed else 0
    base = dict.fromkeys(KINDS, 0)
    base.update(parameters=state["parameters"], optimizer=state["optimizer"])
    base["workspace"] = hw.workspace
    going = dict(base, gradients=early, activations=activations)
    going["buffers"] = persistent + transient
    out = {"backward": dict(going, temporaries=temporary_bytes(model, b, layout, prec))}
    if mine[-1] == layout.pp * layout.virtual - 1:
        out["loss"] = dict(going, loss=loss_bytes(model, b, layout, prec))
    stepped = stepped_elements(model, layout, rank)
    largest = largest_tensor(model, layout, rank)
    temporaries = optimizer_temporaries(policy, prec, stepped, largest)
    out["step"] = dict(
        base,
        gradients=state["gradients"],
        buffers=persistent,
        temporaries=temporaries,
    )
    return {name: out[name] for name in MOMENTS if name in out}


def moment_total(kinds: dict[str, int]) -> int:
    """The bytes of a moment: its kinds (`KINDS`) added."""
    return sum(kinds[k] for k in KINDS)


def rank_memory(
    model: ModelSpec,
    batch: int,
    policy: DTypePolicy,
    layout: PlanLayout,
    rank: int,
    hw: Hardware = GPUS["h100"],
) -> dict[str, int]:
    """Bytes by kind on pipeline rank `rank` (any dp and tp coordinate), each at
    its largest over the step's moments (an H100 unless `hw` says otherwise)."""
    moments = rank_moments(model, batch, policy, layout, rank, hw)
    return {k: max(m[k] for m in moments.values()) for k in KINDS}


def peak(moments: dict[str, dict[str, int]]) -> tuple[str, dict[str, int]]:
    """(the largest moment's name, its kinds with their 'total'); the first of
    equals in MOMENTS' order."""
    name = max(moments, key=lambda m: moment_total(moments[m]))
    return name, {**moments[name], "total": moment_total(moments[name])}


def reserve_bytes(layout: PlanLayout, hw: Hardware) -> int:
    """What the step needs outside torch's allocator: the CUDA context and NCCL's
    buffers for each process group of more than one rank (an axis above 1)."""
    groups = sum(getattr(layout, a) > 1 for a in ("dp", "tp", "pp", "ep", "cp"))
    return hw.context + hw.nccl * groups


def memory(
    model: ModelSpec,
    batch: int,
    policy: DTypePolicy,
    layout: PlanLayout,
    hw: Hardware = GPUS["h100"],
) -> list[dict[str, dict[str, int]]]:
    """Every pipeline rank's moments, first to last (`rank_moments`)."""
    return [rank_moments(model, batch, policy, layout, r, hw) for r in range(layout.pp)]
