"""`book/scripts/train_gpt.py`'s flags, and the layout and run they describe.

Groups: the layout (or `--plan GPU`), the model (`--model` preset and each size),
the corpus (characters of the book, or a byte-level BPE of the book and the
machine's installed Python), the run, checkpoints, evaluation, what is written
(metrics, TensorBoard, a profiler trace, a CUDA memory snapshot, the loss curve),
and the checks (`--compare`, `--check`).
"""

from __future__ import annotations

import argparse
import os
import time

from distcourse import plan, runtime
from distcourse.train.corpus import BOOK, cache_root
from distcourse.train.layout import DTYPES, SCHEDULES, TrainLayout
from distcourse.train.model import PRESETS
from distcourse.train.trainer import RunConfig

PER_RANK = 8  # sequences a data-parallel rank takes when --batch is not given
LAYOUT_FLAGS = {  # dest -> flag: what --plan chooses, so it must not be given
    "dp": "--dp",
    "pp": "--pp",
    "tp": "--tp",
    "m": "--micro-batches",
    "schedule": "--schedule",
    "virtual": "--virtual",
    "ckpt": "--ckpt",
    "zero": "--zero",
    "fsdp": "--fsdp",
    "cp": "--cp",
    "ep": "--ep",
}


def _layout(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("layout")
    g.add_argument(
        "--dp",
        type=int,
        default=None,
        help="data-parallel degree; default: the ranks the other degrees leave, "
        "WORLD_SIZE / (pp x tp)",
    )
    for flag in ("--pp", "--tp", "--cp", "--ep"):
        g.add_argument(flag, type=int, default=1)
    g.add_argument(  # torchrun's own parser refuses a bare --m as ambiguous
        "--micro-batches",
        "--m",
        dest="m",
        type=int,
        default=1,
        help="per step: through the pipeline, or without one accumulated",
    )
    g.add_argument("--schedule", default="1f1b", help=f"one of {', '.join(SCHEDULES)}")
    g.add_argument(
        "--virtual", type=int, default=1, help="stages per rank (interleaved)"
    )
    g.add_argument(
        "--ckpt", default="none", help="activation checkpointing: none, full"
    )
    g.add_argument("--zero", type=int, default=0, help="ZeRO stage 1, 2 or 3 (FSDP)")
    g.add_argument("--fsdp", action="store_true")
    g.add_argument(
        "--dtype", default="float32", help=f"{', '.join(DTYPES)} (or fp32, bf16)"
    )
    g.add_argument(
        "--plan",
        choices=tuple(plan.GPUS),
        default=None,
        metavar="GPU",
        help=f"the planner's fastest layout on GPU ({', '.join(plan.GPUS)}) that "
        "the trainer runs, for WORLD_SIZE ranks; no other layout flag",
    )


def _model_and_data(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument("--model", default="tiny", choices=tuple(PRESETS))
    g.add_argument("--n-layer", "--layers", dest="n_layer", type=int, default=None)
    g.add_argument("--n-embd", type=int, default=None)
    g.add_argument("--n-head", type=int, default=None)
    g.add_argument("--seq", type=int, default=None, help="tokens per sequence")
    d = p.add_argument_group("corpus")
    d.add_argument(
        "--corpus",
        choices=("auto", "chars", "bpe"),
        default="auto",
        help="the book as characters, or a byte-level BPE of the book and the "
        "installed Python; auto: chars for --model tiny, bpe otherwise",
    )
    d.add_argument("--vocab", type=int, default=32000, help="BPE vocabulary")
    d.add_argument("--corpus-mb", type=float, default=64.0, help="MB of text (bpe)")
    d.add_argument(
        "--bpe-train-mb", type=float, default=16.0, help="MB the BPE learns on"
    )
    d.add_argument(
        "--cache-dir", default=None, help="default $DISTCOURSE_CACHE or ~/.cache"
    )
    d.add_argument("--book", default=str(BOOK), help="folder of the book's pages")
    d.add_argument(
        "--excerpt",
        action="store_true",
        help="the package's frozen excerpt of the book (chapter 13's stored outputs)",
    )


def _run(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("run")
    g.add_argument("--steps", type=int, default=20)
    g.add_argument(
        "--batch",
        type=int,
        default=None,
        help="sequences per step, all ranks together; default 8 a data-parallel "
        "rank (--plan: 8 a rank)",
    )
    g.add_argument(
        "--lr", type=float, default=None, help="default 1e-2 tiny, 6e-4 else"
    )
    g.add_argument("--min-lr", type=float, default=0.1, help="cosine floor, x lr")
    g.add_argument("--warmup", type=int, default=0)
    g.add_argument("--clip", type=float, default=None, help="global gradient norm")
    g.add_argument("--optimizer", choices=("sgd", "adamw"), default="adamw")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--timeout", type=float, default=runtime.DEFAULT_TIMEOUT, help="s")
    g.add_argument("--no-tf32", action="store_true", help="fp32 matmuls without TF32")
    c = p.add_argument_group("checkpoints and evaluation")
    c.add_argument("--ckpt-dir", default=None)
    c.add_argument("--ckpt-every", type=int, default=0)
    c.add_argument(
        "--keep", type=int, default=0, help="newest checkpoints kept (0 all)"
    )
    c.add_argument("--eval-every", type=int, default=0)
    c.add_argument("--eval-batches", type=int, default=2)


def _outputs(p: argparse.ArgumentParser) -> None:
    o = p.add_argument_group("outputs and checks")
    o.add_argument(
        "--metrics",
        default=None,
        help="a JSON line per logged step here (default: a new file under "
        "$DISTCOURSE_CACHE or ~/.cache/distcourse/runs, named at the end; 'none' "
        "writes none)",
    )
    o.add_argument("--tensorboard", default=None, help="TensorBoard logs here")
    o.add_argument("--log-every", type=int, default=1)
    o.add_argument("--profile", default=None, help="torch.profiler traces here")
    o.add_argument("--memory-snapshot", default=None, help="CUDA memory snapshot")
    o.add_argument("--curve", default=None, help="save the loss curve (PNG) here")
    o.add_argument("--losses", default=None, help="save every step's loss (JSON)")
    o.add_argument("--compare", action="store_true")
    o.add_argument(
        "--compare-all",
        action="store_true",
        help="compare every accepted layout of the world and every composition "
        "(layout.compositions) against one process, SGD, in --dtype",
    )
    o.add_argument("--compare-steps", type=int, default=3)
    o.add_argument(
        "--kill",
        default=None,
        metavar="RANK:STEP",
        help="kill -9 RANK mid-step STEP, on torchrun's first attempt (a drill)",
    )
    o.add_argument("--quiet", action="store_true", help="no progress bar")
    o.add_argument("--check", action="store_true", help="check the layout only")


def parser() -> argparse.ArgumentParser:
    """The script's flags."""
    p = argparse.ArgumentParser(description="Train a GPT on any layout of ranks.")
    for add in (_layout, _model_and_data, _run, _outputs):
        add(p)
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


def metrics_path(given: str | None) -> str | None:
    """--metrics: as given ('none': no file), else runs/<UTC time>-<torchrun's
    run id or this process's id>/metrics.jsonl under the cache (every rank names
    the same: rank 0 writes it)."""
    if given is not None:
        return None if given.lower() == "none" else given
    run = os.environ.get("TORCHELASTIC_RUN_ID") or str(os.getpid())
    stamp = time.strftime("%Y%m%d-%H%M", time.gmtime())
    return str(cache_root() / "runs" / f"{stamp}-{run}" / "metrics.jsonl")


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
        args.virtual,
    )
    lr = args.lr if args.lr is not None else (1e-2 if args.model == "tiny" else 6e-4)
    run = RunConfig(
        steps=args.steps,
        batch=args.batch or PER_RANK * (torchrun_world() if args.plan else layout.dp),
        seq=args.seq,
        lr=lr,
        optimizer=args.optimizer,
        warmup=args.warmup,
        min_lr=args.min_lr,
        clip=args.clip,
        seed=args.seed,
        preset=args.model,
        n_layer=args.n_layer,
        n_head=args.n_head,
        n_embd=args.n_embd,
        ckpt_dir=args.ckpt_dir,
        ckpt_every=args.ckpt_every,
        keep=args.keep,
        eval_every=args.eval_every,
        eval_batches=args.eval_batches,
        log_every=args.log_every,
        metrics=metrics_path(args.metrics),
        tensorboard=args.tensorboard,
        timeout=args.timeout,
        quiet=args.quiet,
    )
    return layout, run
