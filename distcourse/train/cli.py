"""`book/scripts/train_gpt.py`'s flags and its main: the trainer under torchrun.

    torchrun --nproc-per-node 8 book/scripts/train_gpt.py \
        --dp 2 --pp 2 --tp 2 --micro-batches 2 --steps 200 \
        --ckpt-dir ckpt --ckpt-every 50 --curve loss.png --compare

Without --dp, data parallelism takes the ranks the other degrees leave: plain
`torchrun --nproc-per-node 8 book/scripts/train_gpt.py --compare` is 8-way DDP.

The layout is checked before any group exists: `--check` (no torchrun) checks it
and starts nothing; under torchrun (which set WORLD_SIZE) every rank checks it
before it joins. A layout the trainer cannot compose ends with a message naming
the flags (argparse's error, exit status 2), and no rank waits for another.

`--plan GPU` (h100, h200, a100: chapter 10's datasheet GPUs) lets the planner
choose the layout: the fastest it predicts on GPU that this trainer runs exactly,
for WORLD_SIZE ranks (1 without torchrun). Each rank computes it before any group
exists, from the same inputs, so all choose the same; rank 0 (and `--check`)
prints it with its predicted step time. The layout flags (--dp --pp --tp
--micro-batches --schedule --ckpt --zero --fsdp --dtype) must then stay at their
defaults (`layout.planned`).

`--compare` first trains `--compare-steps` steps against one process (SGD first,
as AdamW hides a gradient scale; then the run's AdamW) and prints each step's loss
difference and step 1's gradient difference against TOL. Then the run trains
(resuming from `--ckpt-dir` when it holds a checkpoint; a last checkpoint at its
end) and rank 0 prints its losses and saves the loss curve.

The fault drill: `torchrun --max-restarts 1 ... --ckpt-every 2 --kill 1:5` kills
rank 1 in step 5 (`fault`); torchrun restarts the group, which resumes from
step_4 and ends with the losses an uninterrupted run has (`--losses` saves them).
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import replace
from pathlib import Path

import torch.distributed as dist

from distcourse import checks, plan, runtime
from distcourse.examples.gpt import GPTConfig
from distcourse.train import fault
from distcourse.train.compare import TOL, against_one_process, verdicts
from distcourse.train.corpus import BOOK, Corpus
from distcourse.train.layout import TrainLayout, check, planned
from distcourse.train.progress import save_curve
from distcourse.train.trainer import RunConfig, Trainer

SGD_LR = 0.5  # SGD's step lr * g needs a larger rate than AdamW's to learn
LAYOUT_FLAGS = {  # dest -> flag: what --plan chooses, so it must not be given
    "dp": "--dp",
    "pp": "--pp",
    "tp": "--tp",
    "m": "--micro-batches",
    "schedule": "--schedule",
    "ckpt": "--ckpt",
    "zero": "--zero",
    "fsdp": "--fsdp",
    "dtype": "--dtype",
    "cp": "--cp",
    "ep": "--ep",
}


def parser() -> argparse.ArgumentParser:
    """The script's flags: layout (or --plan), run, checkpoints, output."""
    p = argparse.ArgumentParser(description="Train a TinyGPT on the book's text.")
    p.add_argument(
        "--dp",
        type=int,
        default=None,
        help="data-parallel degree; default: the ranks the other degrees leave, "
        "WORLD_SIZE / (pp x tp)",
    )
    for flag in ("--pp", "--tp", "--cp", "--ep"):
        p.add_argument(flag, type=int, default=1)
    p.add_argument(  # torchrun's own parser refuses a bare --m as ambiguous
        "--micro-batches", "--m", dest="m", type=int, default=1, help="per step"
    )
    p.add_argument("--schedule", default="1f1b", help="1f1b or gpipe")
    p.add_argument("--ckpt", default="none", help="activation checkpointing")
    p.add_argument("--zero", type=int, default=0)
    p.add_argument("--fsdp", action="store_true")
    p.add_argument("--dtype", default="float32")
    p.add_argument(
        "--plan",
        choices=tuple(plan.GPUS),
        default=None,
        metavar="GPU",
        help=f"the planner's fastest layout on GPU ({', '.join(plan.GPUS)}) that "
        "the trainer runs, for WORLD_SIZE ranks; no other layout flag",
    )
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=8, help="sequences per step")
    p.add_argument("--seq", type=int, default=32, help="characters per sequence")
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--optimizer", choices=("sgd", "adamw"), default="adamw")
    p.add_argument("--warmup", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--ckpt-dir", default=None)
    p.add_argument("--ckpt-every", type=int, default=0)
    p.add_argument("--compare", action="store_true")
    p.add_argument("--compare-steps", type=int, default=3)
    p.add_argument("--curve", default=None, help="save the loss curve (PNG) here")
    p.add_argument("--losses", default=None, help="save every step's loss (JSON) here")
    p.add_argument(
        "--kill",
        default=None,
        metavar="RANK:STEP",
        help="kill -9 RANK mid-step STEP, on torchrun's first attempt (a drill)",
    )
    p.add_argument("--book", default=str(BOOK), help="folder of the book's pages")
    p.add_argument(
        "--excerpt",
        action="store_true",
        help="train on the package's frozen excerpt of the book, not --book",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument(
        "--check", action="store_true", help="check the layout only, start no rank"
    )
    return p


def torchrun_world(default: int = 1) -> int:
    """WORLD_SIZE as torchrun set it; `default` where no torchrun started us."""
    return int(os.environ.get("WORLD_SIZE", default))


def data_degree(args: argparse.Namespace) -> int:
    """--dp as given; else the ranks the other degrees leave: WORLD_SIZE (1
    without torchrun) over pp x tp x cp x ep, as torchtitan's data_parallel_shard
    -1 fills the world. 1 where that product does not divide it: the layout check
    then names the mismatch."""
    if args.dp is not None:
        return args.dp
    world = torchrun_world()
    rest = args.pp * args.tp * args.cp * args.ep
    return world // rest if rest > 0 and world % rest == 0 else 1


def settings(args: argparse.Namespace) -> tuple[TrainLayout, RunConfig]:
    """The layout and the run the flags describe."""
    layout = TrainLayout(
        data_degree(args),
        args.pp,
        args.tp,
        args.m,
        args.schedule,
        args.ckpt,
        args.zero,
        args.fsdp,
        args.dtype,
        args.cp,
        args.ep,
    )
    run = RunConfig(
        steps=args.steps,
        batch=args.batch,
        seq=args.seq,
        lr=args.lr,
        optimizer=args.optimizer,
        warmup=args.warmup,
        seed=args.seed,
        n_layer=args.layers,
        ckpt_dir=args.ckpt_dir,
        ckpt_every=args.ckpt_every,
        quiet=args.quiet,
    )
    return layout, run


def planned_layout(
    p: argparse.ArgumentParser,
    args: argparse.Namespace,
    cfg: GPTConfig,
    batch: int,
) -> TrainLayout:
    """`--plan`'s layout for WORLD_SIZE ranks (1 without torchrun): argparse's
    error (exit status 2) if a layout flag was given too or the planner has none.
    No message is sent: every rank computes the same answer before any group."""
    given = [f for d, f in LAYOUT_FLAGS.items() if getattr(args, d) != p.get_default(d)]
    if given:
        p.error(
            f"--plan {args.plan} with {', '.join(given)}: --plan chooses the layout; "
            "leave the layout flags at their defaults"
        )
    world = torchrun_world()
    try:
        layout, prediction = planned(world, cfg, batch, plan.named(args.plan))
    except ValueError as err:
        p.error(str(err))
    if args.check or int(os.environ.get("RANK", 0)) == 0:
        ms = prediction.time["total"] * 1e3
        print(
            f"--plan {args.plan}: {layout.name} (dp x pp x tp) on {world} "
            f"rank{'s' if world > 1 else ''}, predicted {ms:.3g} ms per "
            f"step on {args.plan} (the planner's model)"
        )
    return layout


def compare(layout: TrainLayout, run: RunConfig, corpus: Corpus) -> list[str]:
    """`--compare`'s lines (on every rank): SGD, then AdamW if the run uses it."""
    runs = [replace(run, optimizer="sgd", lr=SGD_LR, ckpt_dir=None)]
    if run.optimizer == "adamw":
        runs.append(replace(run, ckpt_dir=None))
    lines = []
    for each in runs:
        found = against_one_process(layout, each, corpus)
        for i, (a, b) in enumerate(zip(found["losses"], found["alone"], strict=True)):
            lines.append(
                f"{each.optimizer} step {i + 1}: loss {a:.4f}, one process {b:.4f}, "
                f"difference {checks.verdict(abs(a - b), TOL['losses'])}"
            )
        lines += verdicts(found)
    return lines


def main(argv: list[str] | None = None) -> None:
    """Parse, check the layout before joining, then compare, train and report."""
    p = parser()
    args = p.parse_args(argv)
    corpus = Corpus.excerpt() if args.excerpt else Corpus.from_book(Path(args.book))
    layout, run = settings(args)
    if args.plan:
        layout = planned_layout(p, args, run.model(corpus), run.batch)
    kill = None
    if args.kill is not None:
        try:
            kill = fault.parse(args.kill)
        except ValueError as err:
            p.error(str(err))
    world = torchrun_world(default=layout.world)
    try:
        check(layout, run.model(corpus), world, run.batch)
    except ValueError as err:
        p.error(str(err))  # every rank, before any group: exit status 2
    if args.check:
        print(f"{layout.name} (dp x pp x tp) fits {world} ranks: accepted")
        return
    info = runtime.init_from_env()
    try:
        if args.compare:
            lines = compare(layout, replace(run, steps=args.compare_steps), corpus)
            if info.rank == 0:
                print(*lines, sep="\n")
        doomed = kill and kill[0] == info.rank and fault.first_attempt()
        trainer = Trainer(layout, run, corpus, kill_at=kill[1] if doomed else None)
        start = trainer.start
        losses = trainer.fit()
        every = run.ckpt_every
        if (
            run.ckpt_dir
            and trainer.step_no > start
            and (not every or len(losses) % every)
        ):
            trainer.save()  # the run's end, unless --ckpt-every just saved it
        trainer.close()
        if info.rank == 0:
            print(
                f"{layout.name} (dp x pp x tp) on {info.world_size} "
                f"rank{'s' if info.world_size > 1 else ''}, "
                f"{runtime.device().type}; corpus {len(corpus.text):,} characters, "
                f"vocabulary {corpus.vocab}; steps {start + 1}-{len(losses)}; "
                f"loss {losses[0]:.4f} -> {losses[-1]:.4f}"
            )
            if args.curve:
                save_curve(losses, args.curve, f"TinyGPT on the book, {layout.name}")
                print(f"loss curve: {args.curve}")
            if args.losses:
                Path(args.losses).write_text(json.dumps(losses), encoding="utf-8")
        dist.barrier()
    finally:
        runtime.shutdown()
