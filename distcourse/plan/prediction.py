"""One prediction (`predict`) and the layouts that fit, fastest first (`search`).

`Prediction.to_dict()` keys (stable; the HTML book's planner uses the same):

    model, policy, layout, hardware   the inputs' own dicts; batch (sequences)
    gpus                              dp x tp x pp x ep x cp
    memory    parameters, gradients, optimizer, activations, loss, temporaries,
              buffers, workspace: bytes on the fullest rank, each kind at its
              own largest over the step; total: the step's peak, the largest
              moment (plan.memory: at most the kinds' sum)
    peak      the same kinds at the fullest rank's peak moment, and their total
    moment    that moment's name: "loss", "backward" or "step"
    moments   each moment's bytes on the fullest rank
    by_rank   each pipeline rank's kinds at its own peak moment, and total
    reserve   bytes the CUDA context and NCCL take outside torch's allocator
    fits      total + reserve <= the hardware's memory
    time      compute, memory, optimizer, bubble, tp, pp, dp (cp, ep above 1),
              total: seconds per step, dp the part not hidden (plan.timing)
    messages  tp, pp, dp (cp, ep): each axis's message seconds before overlap
    wire      tp, pp, dp (cp, ep above 1): wire bytes per step, the busiest
              rank's
    flops     FLOPs per step of the busiest rank
    tokens_per_s  batch x seq / time.total
    mfu       the model's FLOPs per step (3 forwards of every stage, no
              recompute, times d ep m micro-batches) / (gpus x the matmul
              dtype's peak FLOP/s x time.total)
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import Any

from distcourse.plan.checks import check
from distcourse.plan.hardware import Hardware
from distcourse.plan.memory import KINDS, memory, moment_total, peak, reserve_bytes
from distcourse.plan.spec import CKPT, DTypePolicy, ModelSpec, PlanLayout
from distcourse.plan.timing import step_time
from distcourse.plan.work import stage_flops


@dataclass(frozen=True)
class Prediction:
    """What a layout costs one rank: bytes by kind, seconds by part, wire bytes."""

    model: ModelSpec
    batch: int
    policy: DTypePolicy
    layout: PlanLayout
    hardware: Hardware
    memory: dict[str, int] = field(default_factory=dict)
    peak: dict[str, int] = field(default_factory=dict)
    moment: str = ""
    moments: dict[str, int] = field(default_factory=dict)
    by_rank: list[dict[str, int]] = field(default_factory=list)
    reserve: int = 0
    time: dict[str, float] = field(default_factory=dict)
    messages: dict[str, float] = field(default_factory=dict)
    wire: dict[str, int] = field(default_factory=dict)
    flops: int = 0

    @property
    def fits(self) -> bool:
        """The step's peak and the reserve within the GPU's memory."""
        return self.memory["total"] + self.reserve <= self.hardware.memory

    @property
    def tokens_per_s(self) -> float:
        return self.batch * self.model.seq / self.time["total"]

    @property
    def mfu(self) -> float:
        """Model FLOPs of the step (every stage, once) over what the GPUs could do."""
        L = self.layout
        b = self.batch // (L.shares * L.micro_batches)
        plain = PlanLayout(pp=L.pp, virtual=L.virtual, schedule=L.schedule)
        stages = range(L.pp * L.virtual)
        useful = (
            L.shares
            * L.micro_batches
            * sum(stage_flops(self.model, b, plain, k) for k in stages)
        )
        most = self.hardware.peak(self.policy.matmul_dtype)
        return useful / (L.gpus * most * self.time["total"])

    def to_dict(self) -> dict[str, Any]:
        return dict(
            model=self.model.to_dict(),
            batch=self.batch,
            policy=self.policy.to_dict(),
            layout=self.layout.to_dict(),
            hardware=self.hardware.to_dict(),
            gpus=self.layout.gpus,
            memory=dict(self.memory),
            peak=dict(self.peak),
            moment=self.moment,
            moments=dict(self.moments),
            by_rank=[dict(r) for r in self.by_rank],
            reserve=self.reserve,
            fits=self.fits,
            time=dict(self.time),
            messages=dict(self.messages),
            wire=dict(self.wire),
            flops=self.flops,
            tokens_per_s=self.tokens_per_s,
            mfu=self.mfu,
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Prediction:
        """The prediction of a dict's inputs (computed again, so always consistent)."""
        return predict(
            ModelSpec.from_dict(data["model"]),
            data["batch"],
            DTypePolicy.from_dict(data["policy"]),
            PlanLayout.from_dict(data["layout"]),
            Hardware.from_dict(data["hardware"]),
        )


def predict(
    model: ModelSpec,
    batch: int,
    policy: DTypePolicy,
    layout: PlanLayout,
    hw: Hardware,
    gpus: int | None = None,
) -> Prediction:
    """Memory per rank and step time of `layout`; ValueError naming the broken
    constraint if it is impossible (`checks.check`)."""
    check(model, batch, layout, gpus)
    ranks = memory(model, batch, policy, layout, hw)
    peaks = [peak(moments) for moments in ranks]
    fullest = max(range(len(ranks)), key=lambda r: peaks[r][1]["total"])
    moments = ranks[fullest]
    held = {k: max(m[k] for m in moments.values()) for k in KINDS}
    held["total"] = peaks[fullest][1]["total"]
    seconds, messages, wire, flops = step_time(model, batch, policy, layout, hw)
    return Prediction(
        model,
        batch,
        policy,
        layout,
        hw,
        memory=held,
        peak=peaks[fullest][1],
        moment=peaks[fullest][0],
        moments={name: moment_total(kinds) for name, kinds in moments.items()},
        by_rank=[kinds for _, kinds in peaks],
        reserve=reserve_bytes(layout, hw),
        time=seconds,
        messages=messages,
        wire=wire,
        flops=flops,
    )


def divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


DEGREES = ("dp", "tp", "pp", "micro_batches")
CHOICES = {  # ZeRO stage -> the (bucket_view, reshard) pairs the search tries
    0: ((True, True), (False, True)),
    1: ((True, True), (False, True)),
    2: ((True, True),),  # no DDP buckets under ZeRO-2/3: bucket_view is moot
    3: ((True, True), (True, False)),
}


def candidates(
    model: ModelSpec,
    batch: int,
    gpus: int,
    hw: Hardware,
    fixed: dict[str, Any] | None = None,
) -> list[PlanLayout]:
    """Every layout worth trying on `gpus`: tp within a node; m any divisor of the
    share (at least pp: 1F1B, or interleaved 1F1B with 2 stages per rank; with
    pp = 1, gradient accumulation); with tp > 1 sequence parallelism on; ZeRO
    0-3; under ZeRO 0 and 1 gradients as bucket views and not (the views save
    the buckets' bytes at no time in this model: `search` takes them on a tie),
    under ZeRO-3 resharding after forward and not (kept: one all-gather a
    micro-batch fewer, every parameter held); checkpointing none, selective,
    full.
    `fixed` (PlanLayout keys) keeps the degrees it names and sets the other
    fields (ep and cp stay 1 unless fixed; then dp x tp x pp fill the rest).
    Impossible layouts are left out."""
    fixed = dict(fixed or {})
    PlanLayout.from_dict(fixed)  # unknown keys and bad values, by name
    keep = {k: fixed.pop(k) for k in DEGREES if k in fixed}
    ep, cp = fixed.get("ep", 1), fixed.get("cp", 1)
    rest = gpus // (ep * cp) if gpus % (ep * cp) == 0 else 0
    found: dict[PlanLayout, None] = {}  # a set that keeps the order found
    for dp, tp in itertools.product(divisors(rest), divisors(rest)):
        if rest % (dp * tp) or tp > hw.gpus_per_node:
            continue
        pp = rest // (dp * tp)
        share = batch // (dp * ep) if batch % (dp * ep) == 0 else 0
        ms = [m for m in divisors(share) if m >= pp]
        runs = [("1f1b", 1), ("interleaved", 2)] if pp > 1 else [("1f1b", 1)]
        for m, zero, ckpt, (schedule, v) in itertools.product(ms, range(4), CKPT, runs):
            plain = PlanLayout(dp, tp, pp, m, zero, tp > 1, ckpt, schedule, v)
            for view, reshard in CHOICES[fixed.get("zero", zero)]:
                chosen = dataclasses.replace(plain, bucket_view=view, reshard=reshard)
                layout = dataclasses.replace(chosen, **fixed)
                if any(getattr(layout, k) != v for k, v in keep.items()):
                    continue
                try:
                    check(model, batch, layout, gpus)
                except ValueError:
                    continue
                found[layout] = None  # `fixed` can make two choices one layout
    return list(found)


def search(
    model: ModelSpec,
    batch: int,
    policy: DTypePolicy,
    hw: Hardware,
    gpus: int,
    fixed: dict[str, Any] | None = None,
) -> list[Prediction]:
    """Predictions of every candidate layout that fits, fastest first (ties: less
    memory). ValueError if the model and batch admit no layout on `gpus` at all.
    A layout's memory is computed first: one that does not fit is not timed."""
    every = candidates(model, batch, gpus, hw, fixed)
    if not every:
        raise ValueError(
            f"no layout of {gpus} GPUs suits this model and batch"
            + (f" with {fixed}" if fixed else "")
            + ": check that the batch divides by dp x micro-batches, heads and "
            "vocab by tp, layers by pp"
        )
    fitting = [
        predict(model, batch, policy, lay, hw)
        for lay in every
        if fits(model, batch, policy, lay, hw)
    ]
    return sorted(fitting, key=lambda p: (p.time["total"], p.memory["total"]))


def fits(
    model: ModelSpec, batch: int, policy: DTypePolicy, layout: PlanLayout, hw: Hardware
) -> bool:
    """`Prediction.fits` without the time: every pipeline rank's peak and the
    reserve within the hardware's memory."""
    peaks = max(
        peak(moments)[1]["total"]
        for moments in memory(model, batch, policy, layout, hw)
    )
    return peaks + reserve_bytes(layout, hw) <= hw.memory
