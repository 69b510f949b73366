"""`python -m distcourse.plan`: the best layouts for a model on some GPUs, or one.

    python -m distcourse.plan --params 7e9 --gpus 64 --batch 256
    python -m distcourse.plan --layers 2 --hidden 32 --heads 4 --seq 16 --vocab 64 \\
        --batch 8 --dtype fp32 --layout dp=2,tp=2,pp=2,m=2 --json
    python -m distcourse.plan --explain     # every formula the planner uses

Layout keys: dp, tp, pp, m (micro-batches), zero, sp, ckpt, schedule, v (stages per
rank), bucket_view, ep, cp, reshard (ZeRO-3: FSDP's reshard_after_forward, default
1); 0/1 or true/false for sp, bucket_view and reshard. A mixture of
experts: --experts E --top-k k --capacity-factor f (then ep may split them).
`--fix zero=3,tp=8` searches only the layouts with those values (the search keeps
ep = cp = 1 unless fixed). --dtype fp32 | bf16 (bf16 weights, an fp32 master) |
amp-bf16 (fp32 weights under torch.autocast); --reduce defaults to bf16 for bf16,
fp32 otherwise; --optimizer adamw (torch's default: foreach on a GPU) |
adamw-fused | sgd. The hardware is a datasheet GPU (--gpu h100 | h200 | a100)
whose figures --flops, --alpha, --beta, --memory-mib (as nvidia-smi reports it)
or --memory-gb, --bandwidth (bytes/s), --efficiency (matmuls' share of peak, both
dtypes), --gpus-per-node replace (e.g. with chapter 2's fit). The table gives
each kind at its own largest, the total at the step's peak moment ("at").
An impossible input prints one line naming the constraint and exits with 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import NoReturn

from distcourse import tables
from distcourse.parallel.tensor import dtypes
from distcourse.plan import (
    axes,
    checks,
    hardware,
    memory,
    prediction,
    spec,
    timing,
    work,
)
from distcourse.plan.prediction import Prediction

GIB = 2**30
LAYOUT_KEYS = {"m": "micro_batches", "v": "virtual"}


def parse_layout(text: str) -> spec.PlanLayout:
    """'dp=2,tp=2,pp=2,m=4,zero=1,sp=1,ckpt=full' -> PlanLayout."""
    return spec.PlanLayout.from_dict(parse_fields(text))


def parse_fields(text: str) -> dict[str, object]:
    """'dp=2,zero=1,sp=1' -> {'dp': 2, 'zero': 1, 'sp': True} (PlanLayout keys)."""
    values: dict[str, object] = {}
    for item in filter(None, text.split(",")):
        key, sep, raw = item.partition("=")
        key = LAYOUT_KEYS.get(key.strip(), key.strip())
        if not sep:
            raise ValueError(f"layout item {item!r} is not key=value")
        raw = raw.strip()
        if key in ("sp", "bucket_view", "reshard"):
            if raw.lower() not in ("0", "1", "true", "false"):
                raise ValueError(f"{key} must be 0, 1, true or false, got {raw!r}")
            values[key] = raw.lower() in ("1", "true")
        elif key in ("ckpt", "schedule"):
            values[key] = raw
        else:
            try:
                values[key] = int(raw)
            except ValueError:
                raise ValueError(f"{key} must be an integer, got {raw!r}") from None
    return values


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are ValueErrors: `main` prints them as one
    line and exits with 2, as it does an impossible layout."""

    def error(self, message: str) -> NoReturn:
        raise ValueError(message)


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="python -m distcourse.plan", description=__doc__.split("\n")[0]
    )
    p.add_argument("--params", type=float, help="parameters (a GPT shape is derived)")
    for name in ("layers", "hidden", "heads"):
        p.add_argument(f"--{name}", type=int)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--experts", type=int, default=0, help="experts a block (0: dense)")
    p.add_argument("--top-k", type=int, default=1, help="experts a token")
    p.add_argument("--capacity-factor", type=float, default=1.25)
    p.add_argument("--batch", type=int, default=256, help="global batch, sequences")
    p.add_argument("--gpus", type=int)
    p.add_argument("--layout", help="one layout: dp=8,tp=8,pp=1,m=1,zero=1,...")
    p.add_argument("--fix", help="search only layouts with these: zero=3,ckpt=full")
    p.add_argument("--dtype", choices=spec.DTYPES, default="bf16")
    p.add_argument("--reduce", choices=spec.REDUCES, help="gradient reduce dtype")
    p.add_argument("--optimizer", choices=spec.OPTIMIZERS, default="adamw")
    p.add_argument("--gpu", default="h100", help=", ".join(hardware.GPUS))
    names = ("flops", "alpha", "beta", "memory-gb", "memory-mib", "bandwidth")
    for name in (*names, "efficiency"):
        p.add_argument(f"--{name}", type=float)
    p.add_argument("--gpus-per-node", type=int)
    p.add_argument("--top", type=int, default=5)
    p.add_argument("--json", action="store_true")
    p.add_argument("--explain", action="store_true", help="print every formula")
    return p


def model_of(args: argparse.Namespace) -> spec.ModelSpec:
    moe = dict(
        experts=args.experts, top_k=args.top_k, capacity_factor=args.capacity_factor
    )
    if args.params is not None:
        shape = spec.ModelSpec.from_params(args.params, args.seq, args.vocab)
        return dataclasses.replace(shape, **moe)
    if args.layers is None or args.hidden is None:
        raise ValueError("give --params, or --layers and --hidden (and --heads)")
    heads = args.heads if args.heads is not None else max(1, args.hidden // 128)
    return spec.ModelSpec(args.layers, args.hidden, heads, args.seq, args.vocab, **moe)


def hardware_of(args: argparse.Namespace) -> hardware.Hardware:
    hw = hardware.named(args.gpu)
    changes: dict[str, object] = {}
    if args.flops is not None:
        changes.update(flops_fp32=args.flops, flops_bf16=args.flops)
    if args.alpha is not None:
        changes.update(alpha_node=args.alpha, alpha_network=args.alpha)
    if args.beta is not None:
        changes.update(beta_node=args.beta, beta_network=args.beta)
    if args.memory_gb is not None:
        changes["memory"] = int(args.memory_gb * hardware.GB)
    if args.memory_mib is not None:
        changes["memory"] = int(args.memory_mib * hardware.MIB)
    if args.bandwidth is not None:
        changes["bandwidth"] = args.bandwidth
    if args.efficiency is not None:
        changes.update(efficiency_fp32=args.efficiency, efficiency_bf16=args.efficiency)
    if args.gpus_per_node is not None:
        changes["gpus_per_node"] = args.gpus_per_node
    if changes:
        hw = dataclasses.replace(hw, name=f"{hw.name} (changed)", **changes)
    return hw


def unit(nbytes: int) -> tuple[str, int]:
    """GiB, MiB or KiB: the largest that `nbytes` reaches (at least KiB)."""
    for name, size in (("GiB", 2**30), ("MiB", 2**20)):
        if nbytes >= size:
            return name, size
    return "KiB", 2**10


KIND_HEADS = ("param", "grad", "optim", "act", "loss", "temp", "buf", "ws")
PART_HEADS = ("compute", "memory", "optim", "bubble")


def table(found: list[Prediction]) -> str:
    """One line per prediction: layout, memory by kind (each at its largest), the
    peak and its moment, seconds by part (dp: what compute does not hide)."""
    name, size = unit(max(p.memory["total"] for p in found))
    extra = tuple(a for a in ("cp", "ep") if any(a in p.time for p in found))
    head = (
        *("dp x tp x pp", "schedule", "m", "zero", "sp", "ckpt"),
        *KIND_HEADS,
        f"total {name}",
        "at",
        *(f"{h} s" if h == "optim" else h for h in PART_HEADS),
        *timing.AXES,
        *extra,
        "step s",
        "MFU",
    )
    rows = [head]
    for p in found:
        L, mem, t = p.layout, p.memory, p.time
        parts = (*timing.PARTS, *timing.AXES, *extra, "total")
        rows.append(
            (
                L.name,
                L.schedule if L.virtual == 1 else f"{L.schedule} v={L.virtual}",
                L.micro_batches,
                L.zero,
                int(L.sp),
                L.ckpt,
                *(f"{mem[k] / size:.1f}" for k in (*memory.KINDS, "total")),
                p.moment,
                *(f"{t.get(k, 0.0):.3g}" for k in parts),
                f"{p.mfu:.0%}",
            )
        )
    return tables.aligned(rows)


def explain() -> str:
    """The docstrings that hold the formulas, in the order a prediction uses them."""
    parts = (spec, checks, dtypes, memory, axes, work, timing, hardware, prediction)
    return "\n\n".join(f"== {m.__name__} ==\n{m.__doc__.strip()}" for m in parts)


def run(argv: list[str]) -> str:
    """The output for `argv` (text or JSON); ValueError for impossible input."""
    args = parser().parse_args(argv)
    if args.explain:
        return explain()
    model, hw = model_of(args), hardware_of(args)
    reduce = args.reduce or ("bf16" if args.dtype == "bf16" else "fp32")
    policy = spec.DTypePolicy(args.dtype, reduce, args.optimizer)
    if args.layout is not None:
        found = [
            prediction.predict(
                model, args.batch, policy, parse_layout(args.layout), hw, args.gpus
            )
        ]
    else:
        if args.gpus is None:
            raise ValueError("give --gpus (or one --layout)")
        fixed = parse_fields(args.fix) if args.fix else None
        found = prediction.search(model, args.batch, policy, hw, args.gpus, fixed)
        found = found[: args.top]
    if args.json:
        return json.dumps([p.to_dict() for p in found], indent=1)
    lines = [
        f"model: {model.layers} layers x {model.hidden} wide, {model.heads} heads, "
        f"seq {model.seq}, vocab {model.vocab}: {model.params:.3g} parameters; "
        f"batch {args.batch}; {policy.dtype} (reduce {policy.reduce}), "
        f"{policy.optimizer}",
        f"hardware: {hw.name}, {hw.memory / hardware.MIB:,.0f} MiB = "
        f"{hw.memory / GIB:.1f} GiB, "
        f"{hw.rate(policy.matmul_dtype) / 1e12:.3g} TFLOP/s reached in "
        f"{policy.matmul_dtype} "
        f"({hw.rate(policy.matmul_dtype) / hw.peak(policy.matmul_dtype):.0%} of "
        f"peak), {hw.streamed / 1e12:.3g} TB/s",
    ]
    if not found:
        return "\n".join([*lines, "no layout fits: more GPUs, ZeRO-3 or checkpointing"])
    return "\n".join([*lines, table(found)])


def main(argv: list[str] | None = None) -> int:
    try:
        print(run(sys.argv[1:] if argv is None else argv))
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0
