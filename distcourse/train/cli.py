"""`book/scripts/train_gpt.py`'s main: the trainer with or without torchrun.

    python book/scripts/train_gpt.py --model gpt2-124m --batch 1 --seq 128 --steps 2
    torchrun --nproc-per-node 8 book/scripts/train_gpt.py \
        --dp 2 --pp 2 --tp 2 --micro-batches 2 --steps 200 --dtype bf16 \
        --ckpt-dir ckpt --ckpt-every 50 --metrics run.jsonl --compare

Without torchrun the script is one process on the machine's device (a GPU if
there is one: world 1, all its cores on a CPU). Without --dp, data parallelism
takes the ranks the other degrees leave: `torchrun --nproc-per-node 8
train_gpt.py --compare` is 8-way DDP.

The layout is checked before any group exists: `--check` checks it and starts
nothing; under torchrun every rank checks it before it joins. A layout the
trainer cannot compose ends with a message naming the flags (argparse's error,
exit status 2), and no rank waits for another. `--plan GPU` lets chapter 10's
planner choose it (`layout.planned`).

`--compare` first trains `--compare-steps` steps against one process (SGD first,
as AdamW hides a gradient scale; then the run's AdamW) and prints each check's
verdict. Then the run trains (resuming from `--ckpt-dir` when it holds a
checkpoint; a last checkpoint at its end), writing `--metrics` / `--tensorboard`
records, and rank 0 prints its summary. `--profile DIR` writes torch.profiler
traces of steps 2-3; on a GPU `--memory-snapshot PATH` writes torch's memory
snapshot after step 3 (rank r's to PATH.r).

The fault drill: `torchrun --max-restarts 1 ... --ckpt-every 2 --kill 1:5` kills
rank 1 in step 5 (`fault`); torchrun restarts the group, which resumes from
step_4 and ends with the losses an uninterrupted run has (`--losses` saves them).
"""

from __future__ import annotations

import argparse
import json
import os
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from distcourse import accelerator, checks, plan, runtime
from distcourse.examples.gpt import GPTConfig
from distcourse.rendezvous import LOOPBACK
from distcourse.train import fault
from distcourse.train.compare import against_each, against_one_process, verdicts
from distcourse.train.corpus import Corpus
from distcourse.train.flags import LAYOUT_FLAGS, parser, settings, torchrun_world
from distcourse.train.layout import TrainLayout, check, compositions, planned
from distcourse.train.progress import save_curve
from distcourse.train.trainer import RunConfig, Trainer

SGD_LR = 0.5  # SGD's step lr * g needs a larger rate than AdamW's to learn


def corpus_of(args: argparse.Namespace) -> Any:
    """The corpus the flags name: characters (the book, or its frozen excerpt)
    or the BPE corpus of the book and the installed Python (`tokens`)."""
    kind = args.corpus
    if kind == "auto":
        kind = "chars" if args.model == "tiny" else "bpe"
    if kind == "chars":
        return Corpus.excerpt() if args.excerpt else Corpus.from_book(Path(args.book))
    from distcourse.train import tokens  # Hugging Face tokenizers, for this only

    if args.excerpt:  # fixed text, for fixed outputs: its 4 KiB pieces
        docs = tokens.pieces("excerpt", Corpus.excerpt().text)
    else:
        docs = tokens.documents(args.corpus_mb, Path(args.book))
    root = Path(args.cache_dir) if args.cache_dir else None
    return tokens.build(docs, args.vocab, train_mb=args.bpe_train_mb, root=root)


def planned_layout(
    p: argparse.ArgumentParser, args: argparse.Namespace, cfg: GPTConfig, batch: int
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
    return replace(layout, dtype=args.dtype)


def compare(layout: TrainLayout, run: RunConfig, corpus: Any) -> list[str]:
    """`--compare`'s lines (on every rank): SGD, then AdamW if the run uses it."""
    runs = [
        replace(
            run,
            optimizer="sgd",
            lr=SGD_LR,
            ckpt_dir=None,
            metrics=None,
            tensorboard=None,
        )
    ]
    if run.optimizer == "adamw":
        runs.append(replace(run, ckpt_dir=None, metrics=None, tensorboard=None))
    lines = []
    for each in runs:
        found = against_one_process(layout, each, corpus)
        for i, (a, b) in enumerate(zip(found["losses"], found["alone"], strict=True)):
            lines.append(
                f"{each.optimizer} step {i + 1}: loss {a:.4f}, one process {b:.4f}, "
                f"difference {checks.verdict(abs(a - b), found['tol']['losses'])}"
            )
        mine = verdicts(found)
        # AdamW's step-1 gradients are SGD's (no step has run): said once
        lines += mine if each.optimizer == "sgd" else mine[1:]
    return lines


def compare_all(layouts: list[TrainLayout], run: RunConfig, corpus: Any) -> list[str]:
    """`--compare-all`'s lines (on every rank): each layout's verdicts against one
    process, SGD (the check a gradient scale cannot pass unseen)."""
    sgd = replace(
        run, optimizer="sgd", lr=SGD_LR, ckpt_dir=None, metrics=None, tensorboard=None
    )
    return [line for f in against_each(layouts, sgd, corpus) for line in verdicts(f)]


def join(args: argparse.Namespace) -> runtime.RankInfo:
    """torchrun's group, or without torchrun a group of one on this machine's
    device with all its cores (a store in this process: nobody to meet)."""
    if "RANK" in os.environ:
        return runtime.init_from_env(timeout=args.timeout)
    store = dist.HashStore()
    return runtime.init(
        0, 1, store=store, host=LOOPBACK, threads=None, timeout=args.timeout
    )


def profiler(args: argparse.Namespace, rank: int) -> Any:
    """torch.profiler over steps 2-3 writing traces to --profile, or nothing."""
    if not args.profile:
        return nullcontext()
    from torch.profiler import (
        ProfilerActivity,
        profile,
        schedule,
        tensorboard_trace_handler,
    )

    kinds = [ProfilerActivity.CPU]
    if accelerator.is_cuda(runtime.device()):
        kinds.append(ProfilerActivity.CUDA)
    return profile(
        activities=kinds,
        schedule=schedule(wait=1, warmup=0, active=2, repeat=1),
        on_trace_ready=tensorboard_trace_handler(
            args.profile, worker_name=f"rank{rank}"
        ),
    )


def train(
    args: argparse.Namespace,
    layout: TrainLayout,
    run: RunConfig,
    corpus: Any,
    info: runtime.RankInfo,
) -> None:
    """The run itself, after --compare: train, save, write, report."""
    kill = fault.parse(args.kill) if args.kill else None
    doomed = kill and kill[0] == info.rank and fault.first_attempt()
    snapshot = args.memory_snapshot and accelerator.is_cuda(runtime.device())
    if snapshot:
        torch.cuda.memory._record_memory_history(max_entries=100_000)
    trainer = Trainer(layout, run, corpus, kill_at=kill[1] if doomed else None)
    start = trainer.start
    with profiler(args, info.rank) as prof:
        if snapshot:
            trainer.fit(
                until=min(run.steps, start + 3), profiler=prof if args.profile else None
            )
            torch.cuda.memory._dump_snapshot(f"{args.memory_snapshot}.{info.rank}")
        losses = trainer.fit(profiler=prof if args.profile else None)
    every = run.ckpt_every
    if run.ckpt_dir and trainer.step_no > start and (not every or len(losses) % every):
        trainer.save()  # the run's end, unless --ckpt-every just saved it
    line = trainer.progress.line() if trainer.progress else ""
    trainer.close()
    if info.rank == 0:
        print(
            f"{layout.name} (dp x pp x tp) on {info.world_size} "
            f"rank{'s' if info.world_size > 1 else ''}, {runtime.device().type}; "
            f"model {trainer.cfg.n_layer} x {trainer.cfg.n_embd}, vocabulary "
            f"{trainer.cfg.vocab}; steps {start + 1}-{len(losses)}; "
            f"loss {losses[0]:.4f} -> {losses[-1]:.4f}"
        )
        print(line)
        if run.metrics:
            print(f"metrics: {run.metrics}")
        if args.curve:
            save_curve(losses, args.curve, f"{run.preset} on {layout.name}")
            print(f"loss curve: {args.curve}")
        if args.losses:
            Path(args.losses).write_text(json.dumps(losses), encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    """Parse, check the layout before joining, then compare, train and report."""
    p = parser()
    args = p.parse_args(argv)
    layout, run = settings(args)
    if args.kill is not None:
        try:
            fault.parse(args.kill)
        except ValueError as err:
            p.error(str(err))
    if args.memory_snapshot and not torch.cuda.is_available():
        p.error("--memory-snapshot records CUDA's allocator: it needs a GPU")
    corpus = corpus_of(args)
    cfg = run.model(corpus)
    if args.plan:
        layout = planned_layout(p, args, cfg, run.batch)
    world = torchrun_world(default=layout.world if args.check else 1)
    try:
        check(layout, cfg, world, run.batch)
    except ValueError as err:
        p.error(str(err))  # every rank, before any group: exit status 2
    if args.check:
        ranks = f"{world} rank{'s' if world > 1 else ''}"
        print(f"{layout.name} (dp x pp x tp) fits {ranks}: accepted")
        return
    info = join(args)
    if accelerator.is_cuda(runtime.device()) and not args.no_tf32:
        torch.backends.cuda.matmul.allow_tf32 = True  # fp32 matmuls on tensor cores
        torch.backends.cudnn.allow_tf32 = True
    try:
        short = replace(run, steps=args.compare_steps)
        if args.compare_all:
            every = compositions(info.world_size, cfg, run.batch, layout.dtype)
            lines = compare_all(every, short, corpus)
            if info.rank == 0:
                print(*lines, sep="\n")
                passed = sum(line.endswith("PASS") for line in lines)
                print(f"{len(every)} layouts: {passed} of {len(lines)} checks PASS")
        if args.compare:
            lines = compare(layout, short, corpus)
            if info.rank == 0:
                print(*lines, sep="\n")
        train(args, layout, run, corpus, info)
        dist.barrier()
    finally:
        runtime.shutdown()
