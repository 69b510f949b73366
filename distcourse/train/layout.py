"""The trainer's layout: the flags of `train_gpt.py` checked before any rank starts.

A layout is chapter 8's dp x pp x tp grid (`parallel.hybrid.Layout`, TP innermost)
plus how each part runs: micro-batches and the pipeline schedule, activation
checkpointing, ZeRO or FSDP, the dtype. The trainer composes in torchtitan's order:
pipeline split (chapter 5) -> tensor parallelism (chapter 4) -> activation
checkpointing (chapter 10) -> data parallelism (chapter 3's buckets), or, on a
data-parallel layout, FSDP (chapter 9; `--fsdp` and `--zero 3` are the same).

`check` refuses, with a ValueError naming the flags, what the degrees cannot
split (a world of another size, blocks into stages, heads and the vocabulary into
TP slices, the batch into dp shares of micro-batches) and what this trainer does
not compose (e.g. "--fsdp with --pp"). It sends no message: `train_gpt.py
--check` runs it with no rank at all, and under torchrun every rank runs it before
it joins a group, so a refusal ends each rank at once, none waiting for another.

`--plan GPU` takes the layout from chapter 10's planner instead (`planned`):
`from_plan` maps a planner layout onto this trainer's where one runs it exactly,
and `fastest_accepted` keeps the fastest of the planner's predictions that maps
and passes `check`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from distcourse import plan
from distcourse.arguments import positive_int
from distcourse.examples.gpt import GPTConfig
from distcourse.parallel.hybrid import Layout, layouts
from distcourse.parallel.hybrid.layout import check as check_hybrid

SCHEDULES = ("1f1b", "gpipe")  # HybridGPT's pipeline schedules (chapter 5)
CHECKPOINTING = ("none", "full")  # activation checkpointing of each block
DTYPES = ("float32",)


@dataclass(frozen=True)
class TrainLayout:
    """dp x pp x tp degrees and how the parts run: `micro_batches` per step through
    the pipeline with `schedule`, `ckpt` (activation checkpointing: "none" or
    "full"), `zero` (0 = plain data parallelism; 1, 2, 3 ZeRO stages), `fsdp`
    (ZeRO-3 as FSDP), `dtype` of the parameters; `cp` and `ep` (context and
    expert parallelism) exist to be refused by name above 1: not composed here."""

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

    def __post_init__(self) -> None:
        for name in ("dp", "pp", "tp", "micro_batches", "cp", "ep"):
            positive_int(getattr(self, name), name)

    @property
    def grid(self) -> Layout:
        """The hybrid layout (dp, pp, tp) the mesh is built from."""
        return Layout(self.dp, self.pp, self.tp)

    @property
    def world(self) -> int:
        """Ranks it needs: dp x pp x tp."""
        return self.dp * self.pp * self.tp

    @property
    def name(self) -> str:
        """'2x2x1 m2 1f1b' (dp x pp x tp, micro-batches, schedule) and any extras."""
        parts = [self.grid.name]
        if self.pp > 1:
            parts += [f"m{self.micro_batches}", self.schedule]
        if self.ckpt != "none":
            parts.append(f"ckpt={self.ckpt}")
        if self.fsdp or self.zero:
            parts.append("fsdp" if self.fsdp else f"zero{self.zero}")
        return " ".join(parts)


def refuse_pairs(layout: TrainLayout) -> None:
    """ValueError naming the flags if this trainer cannot compose them."""
    sharded = "--fsdp" if layout.fsdp else f"--zero {layout.zero}"
    if layout.zero not in (0, 1, 2, 3):
        raise ValueError(f"--zero {layout.zero}: ZeRO has stages 1, 2 and 3")
    if layout.fsdp or layout.zero:
        for flag, degree in (("--pp", layout.pp), ("--tp", layout.tp)):
            if degree > 1:
                raise ValueError(
                    f"{sharded} with {flag} {degree}: this trainer shards only a "
                    "data-parallel layout (chapter 9's fsdp_tp composes FSDP with "
                    "TP on blocks, not in this trainer)"
                )
        if layout.ckpt != "none":
            raise ValueError(
                f"--ckpt {layout.ckpt} with {sharded}: the book's FSDP reshards a "
                "block before its checkpoint recomputes it (not composed)"
            )
        if layout.zero in (1, 2):
            raise ValueError(
                f"--zero {layout.zero}: this trainer shards with FSDP (--zero 3 or "
                "--fsdp); ZeRO-1 and 2 are not composed here yet"
            )
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
    if layout.ckpt not in CHECKPOINTING:
        raise ValueError(f"--ckpt {layout.ckpt}: use one of {CHECKPOINTING}")
    if layout.dtype not in DTYPES:
        raise ValueError(
            f"--dtype {layout.dtype}: the trainer composes {DTYPES} only "
            "(mixed precision with --pp and --tp is not composed yet)"
        )
    if layout.micro_batches > 1 and layout.pp == 1:
        raise ValueError(f"--m {layout.micro_batches} with --pp 1: needs a pipeline")


def check(
    layout: TrainLayout, cfg: GPTConfig, world: int | None = None, batch: int = 8
) -> None:
    """ValueError naming the flags or the degree if `layout` cannot train `cfg` on
    `world` ranks with global batches of `batch` sequences. Sends no message."""
    refuse_pairs(layout)
    check_hybrid(
        layout.grid, cfg, world, batch=batch, micro_batches=layout.micro_batches
    )


def accepted(
    world: int, cfg: GPTConfig, batch: int = 8, micro_batches: int = 2
) -> list[TrainLayout]:
    """Every dp x pp x tp layout of `world` ranks the trainer accepts for `cfg`:
    `micro_batches` where there is a pipeline, 1 elsewhere."""
    found = []
    for grid in layouts(world):
        m = micro_batches if grid.pp > 1 else 1
        layout = TrainLayout(grid.dp, grid.pp, grid.tp, micro_batches=m)
        try:
            check(layout, cfg, world, batch)
        except ValueError:
            continue
        found.append(layout)
    return found


def from_plan(p: plan.PlanLayout) -> TrainLayout | None:
    """The trainer's layout that runs the planner's `p` exactly, or None where it
    has no such option: experts or context parallelism (ep, cp > 1), sequence
    parallelism, virtual stages or the interleaved schedule, selective
    checkpointing, ZeRO-1 or 2, FSDP that keeps parameters gathered (reshard
    False). ZeRO-3 becomes `fsdp=True`. `bucket_view` changes only the planner's
    memory, not its time, so it is not asked (the search ranks the view first)."""
    runs = (
        p.ep == p.cp == p.virtual == 1
        and not p.sp
        and p.reshard
        and p.schedule in SCHEDULES
        and p.ckpt in CHECKPOINTING
        and p.zero in (0, 3)
    )
    if not runs:
        return None
    return TrainLayout(
        p.dp, p.pp, p.tp, p.micro_batches, p.schedule, p.ckpt, fsdp=p.zero == 3
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
        if layout is None:
            continue
        try:
            check(layout, cfg, world, batch)
        except ValueError:
            continue
        return layout, prediction
    raise ValueError(
        f"--plan: none of the planner's {seen} layouts of {world} ranks that fit "
        "is one this trainer runs (it composes dp x pp x tp with 1F1B or GPipe, --ckpt "
        f"{'/'.join(CHECKPOINTING)} and FSDP on dp alone; batch {batch})"
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
