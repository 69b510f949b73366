"""The checks that refuse an impossible layout, by name, before anything is
computed or sent (`check`); the inputs are `plan.spec`'s."""

from __future__ import annotations

from distcourse.plan.spec import ModelSpec, PlanLayout, count


def check(
    model: ModelSpec, batch: int, layout: PlanLayout, gpus: int | None = None
) -> None:
    """ValueError naming the constraint an impossible layout breaks (none sent).

    dp x tp x pp x ep x cp = gpus; tp divides heads, hidden and vocab (heads and the
    vocabulary split by TP); with sp, tp divides seq; pp divides layers (equal
    stages; at most one stage per block); with interleaving, pp x virtual divides
    layers and virtual >= 2; virtual > 1 only for interleaved; the batch divides
    into dp x ep shares of micro_batches equal micro-batches; ep > 1 needs
    experts > 0, and ep divides experts; with cp > 1, seq splits into 2 x cp
    zig-zag chunks (and with sp, seq / cp into tp); with pp > 1, 1F1B and
    interleaved need micro_batches >= pp, interleaving needs pp > 1 and m to
    split into m // pp equal rounds (`pipeline.schedules.interleaved`). (With
    pp = 1, micro_batches > 1 is gradient accumulation: the micro-batches run
    one after another, their gradients summed before one reduction. The package's
    HybridGPT takes micro-batches only with a pipeline.) reshard=False is FSDP's
    reshard_after_forward=False: a ZeRO-3 setting only.
    """
    count(batch, "batch")
    L = layout
    if gpus is not None and L.gpus != gpus:
        extra = f" x ep={L.ep} x cp={L.cp}" if L.ep * L.cp > 1 else ""
        raise ValueError(
            f"dp={L.dp} x tp={L.tp} x pp={L.pp}{extra} = {L.gpus} GPUs, "
            f"but there are {gpus}"
        )
    if not L.reshard and L.zero != 3:
        raise ValueError(
            f"reshard=False (FSDP's reshard_after_forward=False) needs zero=3, "
            f"got zero={L.zero}"
        )
    if L.ep > 1 and not model.experts:
        raise ValueError(f"expert parallelism ep={L.ep} needs experts > 0")
    if model.experts % L.ep:
        raise ValueError(
            f"experts={model.experts} do not divide into ep={L.ep} equal groups"
        )
    if L.cp > 1 and model.seq % (2 * L.cp):
        raise ValueError(
            f"context parallel: seq={model.seq} does not split into 2 x cp="
            f"{2 * L.cp} zig-zag chunks"
        )
    for name, value in (
        ("heads", model.heads),
        ("hidden", model.hidden),
        ("vocab", model.vocab),
    ):
        if value % L.tp:
            raise ValueError(f"{name}={value} is not divisible by tp={L.tp}")
    if L.sp and (model.seq // L.cp) % L.tp:
        part = f" / cp={L.cp}" if L.cp > 1 else ""
        raise ValueError(
            f"sequence parallel: seq={model.seq}{part} is not divisible by tp={L.tp}"
        )
    if L.sp and L.tp == 1:
        raise ValueError("sequence parallel (sp) needs tp > 1")
    stages = L.pp * L.virtual
    if stages > model.layers:
        raise ValueError(
            f"pp={L.pp} x virtual={L.virtual} = {stages} stages, "
            f"more than layers={model.layers}"
        )
    if model.layers % stages:
        raise ValueError(
            f"layers={model.layers} do not divide into {stages} equal stages "
            f"(pp={L.pp} x virtual={L.virtual})"
        )
    if L.schedule == "interleaved" and L.virtual < 2:
        raise ValueError("the interleaved schedule needs virtual >= 2 stages per rank")
    if L.schedule != "interleaved" and L.virtual > 1:
        raise ValueError(
            f"virtual={L.virtual} stages per rank needs schedule=interleaved"
        )
    if L.schedule == "interleaved" and L.pp == 1:
        raise ValueError("the interleaved schedule needs a pipeline: pp=1")
    rounds = max(1, L.micro_batches // L.pp)
    if L.schedule == "interleaved" and L.micro_batches % rounds:
        raise ValueError(
            f"interleaved 1F1B runs micro-batches in m // pp = {rounds} equal rounds:"
            f" micro_batches={L.micro_batches} does not split into {rounds}"
        )
    if L.pp > 1 and L.schedule != "gpipe" and L.micro_batches < L.pp:
        raise ValueError(
            f"{L.schedule} needs micro_batches >= pp: {L.micro_batches} < pp={L.pp}"
        )
    d = f"dp={L.dp}" if L.ep == 1 else f"dp x ep={L.shares}"
    if batch % L.shares:
        raise ValueError(f"batch={batch} does not split into {d} equal shares")
    if (batch // L.shares) % L.micro_batches:
        raise ValueError(
            f"a share of {batch // L.shares} (batch {batch} / {d}) does not split "
            f"into micro_batches={L.micro_batches}"
        )
