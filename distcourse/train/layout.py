"""The trainer's layout: the flags of `train_gpt.py` checked before any rank starts.

A layout is chapter 8's dp x pp x tp grid (`parallel.hybrid.Layout`, TP innermost)
plus how each part runs: micro-batches (through the pipeline, or, without one,
one after another: gradient accumulation) and the pipeline schedule (1F1B, GPipe,
or interleaved 1F1B with `virtual` stages per rank), activation checkpointing,
the data-parallel axis's way (plain buckets, ZeRO-1 or 2, or FSDP: `--fsdp` and
`--zero 3` are the same), the dtype (float32, or bfloat16: autocast, or FSDP's
bf16 parameters). The trainer composes in torchtitan's order: pipeline split
(chapter 5) -> tensor parallelism (chapter 4) -> activation checkpointing
(chapter 10) -> data parallelism (chapter 3's buckets, chapter 9's ZeRO or FSDP).
Every combination composes; only context and expert parallelism (`--cp`, `--ep`
above 1) are refused, by name: chapters 12b and 12 train them on their own.

`check` refuses, with a ValueError naming the flags, what the degrees cannot
split (a world of another size, blocks into stages, heads and the vocabulary into
TP slices, the batch into dp shares of micro-batches) and what no schedule runs.
It sends no message: `train_gpt.py --check` runs it with no rank at all, and
under torchrun every rank runs it before it joins a group, so a refusal ends each
rank at once, none waiting for another.

`--plan GPU` takes the layout from chapter 10's planner instead (`planned`):
`from_plan` maps a planner layout onto this trainer's where one runs it exactly,
and `fastest_accepted` keeps the fastest of the planner's predictions that maps
and passes `check`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, replace

import torch

from distcourse import plan
from distcourse.arguments import positive_int
from distcourse.examples.gpt import GPTConfig
from distcourse.parallel.hybrid import Layout, layouts
from distcourse.parallel.hybrid.layout import check as check_hybrid
from distcourse.parallel.pipeline import interleaved

SCHEDULES = ("1f1b", "gpipe", "interleaved")  # HybridGPT's (chapter 5's)
CHECKPOINTING = ("none", "full")  # activation checkpointing of each block
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
ALIASES = {"fp32": "float32", "bf16": "bfloat16"}


@dataclass(frozen=True)
class TrainLayout:
    """dp x pp x tp degrees and how the parts run: `micro_batches` per step (with
    a pipeline, through it with `schedule` and `virtual` stages per rank; without
    one, accumulated), `ckpt` ("none" or "full"), `zero` (0 = plain data
    parallelism; 1, 2, 3 ZeRO stages), `fsdp` (ZeRO-3 as FSDP), `dtype`
    ("float32" or "bfloat16"); `cp` and `ep` (context and expert parallelism)
    exist to be refused by name above 1: not composed here."""

    dp: int = 1
    pp: int = 1
    tp: int = 1
    micro_batches: int = 1
    schedule: str = "1f1b"
    ckpt: str = "none"
    zero: int = 0
    fsdp: bool = False
    dtype: str = "float32"
    cp: int = 1
    ep: int = 1
    virtual: int = 1

    def __post_init__(self) -> None:
        for name in ("dp", "pp", "tp", "micro_batches", "cp", "ep", "virtual"):
            positive_int(getattr(self, name), name)
        object.__setattr__(self, "dtype", ALIASES.get(self.dtype, self.dtype))

    @property
    def grid(self) -> Layout:
        """The hybrid layout (dp, pp, tp) the mesh is built from."""
        return Layout(self.dp, self.pp, self.tp)

    @property
    def world(self) -> int:
        """Ranks it needs: dp x pp x tp."""
        return self.dp * self.pp * self.tp

    @property
    def data_mode(self) -> str:
        """HybridGPT's data-parallel mode: ddp, zero1, zero2 or fsdp."""
        if self.fsdp or self.zero == 3:
            return "fsdp"
        return f"zero{self.zero}" if self.zero else "ddp"

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def name(self) -> str:
        """'2x2x1 m2 1f1b' (dp x pp x tp, micro-batches, schedule) and any extras:
        'acc2' (micro-batches without a pipeline), 'v2', 'ckpt=full', 'zero1',
        'fsdp', 'bf16'."""
        parts = [self.grid.name]
        if self.pp > 1:
            parts += [f"m{self.micro_batches}", self.schedule]
            if self.virtual > 1:
                parts.append(f"v{self.virtual}")
        elif self.micro_batches > 1:
            parts.append(f"acc{self.micro_batches}")
        if self.ckpt != "none":
            parts.append(f"ckpt={self.ckpt}")
        if self.fsdp or self.zero:
            parts.append("fsdp" if self.fsdp else f"zero{self.zero}")
        if self.dtype != "float32":
            parts.append("bf16")
        return " ".join(parts)


def refuse_pairs(layout: TrainLayout) -> None:
    """ValueError naming the flag whose value no composition runs."""
    if layout.zero not in (0, 1, 2, 3):
        raise ValueError(f"--zero {layout.zero}: ZeRO has stages 1, 2 and 3")
    for flag, degree, kind, chapter in (
        ("--cp", layout.cp, "context", "12b"),
        ("--ep", layout.ep, "expert", "12"),
    ):
        if degree > 1:
            raise ValueError(
                f"{flag} {degree}: this trainer does not compose {kind} parallelism "
                f"(chapter {chapter} trains it with data parallelism on its own)"
            )
    if layout.schedule not in SCHEDULES:
        raise ValueError(
            f"--schedule {layout.schedule}: the trainer's pipeline runs {SCHEDULES}"
        )
    if (layout.schedule == "interleaved") != (layout.virtual > 1):
        raise ValueError(
            f"--schedule {layout.schedule} with --virtual {layout.virtual}: the "
            "interleaved schedule runs 2 or more stages per rank, the others one"
        )
    if layout.virtual > 1 and layout.pp == 1:
        raise ValueError(f"--virtual {layout.virtual} with --pp 1: needs a pipeline")
    if layout.ckpt not in CHECKPOINTING:
        raise ValueError(f"--ckpt {layout.ckpt}: use one of {CHECKPOINTING}")
    if layout.dtype not in DTYPES:
        raise ValueError(f"--dtype {layout.dtype}: use one of {', '.join(DTYPES)}")


def check(
    layout: TrainLayout, cfg: GPTConfig, world: int | None = None, batch: int = 8
) -> None:
    """ValueError naming the flags or the degree if `layout` cannot train `cfg` on
    `world` ranks with global batches of `batch` sequences. Sends no message."""
    refuse_pairs(layout)
    piped = layout.micro_batches if layout.pp > 1 else 1
    check_hybrid(layout.grid, cfg, world, batch=batch, micro_batches=piped)
    stages = layout.pp * layout.virtual
    if cfg.n_layer % stages:
        raise ValueError(
            f"n_layer={cfg.n_layer} blocks do not divide into pp={layout.pp} x "
            f"virtual={layout.virtual} = {stages} stages"
        )
    share = batch // layout.dp
    if share % layout.micro_batches:
        raise ValueError(
            f"a share of {share} (batch {batch} / dp={layout.dp}) does not split "
            f"into {layout.micro_batches} micro-batches"
        )
    if layout.virtual > 1:
        interleaved(layout.pp, layout.micro_batches, layout.virtual)  # its rule


def accepted(
    world: int, cfg: GPTConfig, batch: int = 8, micro_batches: int = 2
) -> list[TrainLayout]:
    """Every dp x pp x tp layout of `world` ranks the trainer accepts for `cfg`:
    `micro_batches` where there is a pipeline, 1 elsewhere."""
    every = (
        TrainLayout(g.dp, g.pp, g.tp, micro_batches=micro_batches if g.pp > 1 else 1)
        for g in layouts(world)
    )
    return [layout for layout in every if passes(layout, cfg, world, batch)]


def passes(layout: TrainLayout, cfg: GPTConfig, world: int, batch: int) -> bool:
    """Whether `check` accepts `layout`."""
    try:
        check(layout, cfg, world, batch)
    except ValueError:
        return False
    return True


def compositions(
    world: int, cfg: GPTConfig, batch: int = 8, dtype: str = "float32"
) -> list[TrainLayout]:
    """What `--compare-all` runs: every accepted dp x pp x tp layout of `world`
    ranks (2 micro-batches through a pipeline), then every way of running the
    parts on two of them, the pure data-parallel one and the one with the most
    axes: ZeRO-1, ZeRO-2, FSDP, FSDP with activation checkpointing, activation
    checkpointing, 2 micro-batches accumulated (no pipeline) or through GPipe,
    interleaved 1F1B on 2 stages per rank; those `check` refuses for `cfg` are
    left out."""
    grids = accepted(world, cfg, batch)
    found = [replace(g, dtype=dtype) for g in grids]
    richest = max(grids, key=lambda g: (g.pp > 1) + (g.tp > 1) + (g.dp > 1))
    for base in dict.fromkeys([grids[0], richest]):
        variants = [
            dict(zero=1),
            dict(zero=2),
            dict(fsdp=True),
            dict(fsdp=True, ckpt="full"),
            dict(ckpt="full"),
            dict(micro_batches=2),
            dict(schedule="gpipe", micro_batches=4),
            dict(schedule="interleaved", virtual=2, micro_batches=2),
        ]
        for change in variants:
            if base.pp == 1 and "schedule" in change:
                continue
            if base.pp > 1 and change == {"micro_batches": 2}:
                continue  # a pipeline's micro-batches are the base already
            layout = replace(base, dtype=dtype, **change)
            if passes(layout, cfg, world, batch):
                found.append(layout)
    return found


MODES = (dict(), dict(zero=1), dict(zero=2), dict(fsdp=True))  # data-parallel ways
SHAPES = ("n_layer=", "n_head=", "vocab=", "a batch of", "a share of", "layout ")


def every_combination(
    world: int, cfg: GPTConfig, batch: int = 8
) -> list[tuple[TrainLayout, str]]:
    """Every dp x pp x tp grid of `world` ranks with every data-parallel way (DDP,
    ZeRO-1, ZeRO-2, FSDP), activation checkpointing or not, float32 or bf16, and
    with a pipeline each schedule (1F1B, GPipe, interleaved on 2 stages a rank),
    2 micro-batches: (layout, "") where `check` accepts it, else (layout, its
    refusal). A refusal that begins with one of SHAPES is the model's or the
    batch's, not a pair of flags the trainer will not compose."""
    found = []
    for grid in layouts(world):
        schedules = (
            [dict()]
            if grid.pp == 1
            else [
                dict(),
                dict(schedule="gpipe"),
                dict(schedule="interleaved", virtual=2),
            ]
        )
        for mode, ckpt, dtype, pipe in itertools.product(
            MODES, CHECKPOINTING, DTYPES, schedules
        ):
            m = 2 if grid.pp > 1 else 1
            layout = TrainLayout(
                grid.dp, grid.pp, grid.tp, m, ckpt=ckpt, dtype=dtype, **mode, **pipe
            )
            try:
                check(layout, cfg, world, batch)
                found.append((layout, ""))
            except ValueError as err:
                found.append((layout, str(err)))
    return found


def from_plan(p: plan.PlanLayout) -> TrainLayout | None:
    """The trainer's layout that runs the planner's `p` exactly, or None where it
    has no such option: experts or context parallelism (ep, cp > 1), sequence
    parallelism, selective checkpointing, FSDP that keeps parameters gathered
    (reshard False). ZeRO-3 becomes `fsdp=True`. `bucket_view` changes only the
    planner's memory, not its time, so it is not asked (the search ranks the view
    first)."""
    runs = (
        p.ep == p.cp == 1
        and not p.sp
        and p.reshard
        and p.schedule in SCHEDULES
        and p.ckpt in CHECKPOINTING
    )
    if not runs:
        return None
    return TrainLayout(
        p.dp,
        p.pp,
        p.tp,
        p.micro_batches,
        p.schedule,
        p.ckpt,
        zero=p.zero if p.zero < 3 else 0,
        fsdp=p.zero == 3,
        virtual=p.virtual,
    )


def fastest_accepted(
    predictions: Iterable[plan.Prediction], cfg: GPTConfig, world: int, batch: int = 8
) -> tuple[TrainLayout, plan.Prediction]:
    """The first of `predictions` (the planner's, fastest first) that the trainer
    runs exactly and `check` accepts for `cfg` on `world` ranks, with it: what
    `--plan` trains. ValueError if none is, so the script ends before any group."""
    seen = 0
    for prediction in predictions:
        seen += 1
        layout = from_plan(prediction.layout)
        if layout is not None and passes(layout, cfg, world, batch):
            return layout, prediction
    raise ValueError(
        f"--plan: none of the planner's {seen} layouts of {world} ranks that fit "
        "is one this trainer runs (it composes dp x pp x tp with 1F1B, GPipe or "
        f"interleaved, --ckpt {'/'.join(CHECKPOINTING)}, ZeRO 1-3; batch {batch})"
    )


POLICY = plan.DTypePolicy("fp32", "fp32", "adamw")  # the trainer's float32, AdamW


def planned(
    world: int, cfg: GPTConfig, batch: int, hw: plan.Hardware
) -> tuple[TrainLayout, plan.Prediction]:
    """`--plan`: the planner's fastest layout for `cfg` on `world` ranks of `hw`
    (global batches of `batch` sequences) that this trainer runs exactly and
    accepts, with its prediction. Sequence parallelism is fixed off (the
    trainer's TP has none; the planner would otherwise turn it on for every
    tp > 1), so TP layouts are predicted as they run. ValueError if none is."""
    found = plan.search(
        plan.ModelSpec.from_config(cfg), batch, POLICY, hw, world, {"sp": False}
    )
    return fastest_accepted(found, cfg, world, batch)
