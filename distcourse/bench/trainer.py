"""`python -m distcourse.bench trainer`: the book's trainer against a plain loop.

The plain loop is nanoGPT's shape: one model, AdamW (fused where torch has the
kernel for the device, as the trainer's), the loss under autocast in bf16, the
learning rate set by hand each step, the loss read back each step. The trainer is
chapter 13's `Trainer` at world 1 (one process, no torchrun) on the same model
(`train.model.one_process`'s numbers), batch, sequence length and device: its
`step()` (the sampler's batch, HybridGPT's step, the schedule's step). Both read
the same windows of the same synthetic token stream (a vocabulary of `vocab`
ids: what the model sees costs the same as a real corpus's).

Timing: after `warmup` steps of each, `rounds` rounds each run one step of both,
in alternating order (so neither always runs first), each step timed on the
device (`clock.DeviceTimer`: CUDA events on a GPU, a synchronize elsewhere).
Reported: each one's median step, the median over rounds of trainer / plain
(the two ran back to back, so slow drifts in load cancel), tokens/s, and on a GPU
with a datasheet peak the trainer's MFU. On a CPU the presets are run at a small
batch and sequence (`--batch`, `--seq`), so that the 124M preset takes seconds.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from types import SimpleNamespace

import torch
import torch.distributed as dist

from distcourse import runtime
from distcourse.bench import common
from distcourse.clock import DeviceTimer
from distcourse.examples.gpt import lm_loss
from distcourse.rendezvous import LOOPBACK
from distcourse.train import RunConfig, Sampler, Trainer, TrainLayout
from distcourse.train import model as model_mod
from distcourse.train.metrics import datasheet_peak
from distcourse.train.state import optimizer_options
from distcourse.train.trainer import lr_factor


@dataclass(frozen=True)
class Case:
    """One comparison: a preset at a batch and sequence length, a dtype."""

    preset: str
    batch: int
    seq: int
    dtype: str = "float32"
    vocab: int = 32000


def plain_loop(
    run: RunConfig, corpus: object, dtype: torch.dtype
) -> Callable[[], float]:
    """nanoGPT's step on the same model and batches: a closure that trains one."""
    device = runtime.device()
    cfg = run.model(corpus)
    model = model_mod.one_process(cfg, run.seed, device)
    options = optimizer_options(run.optimizer, device)
    opt = torch.optim.AdamW(model.parameters(), lr=run.lr, **options)
    sampler = Sampler(corpus.train, run.batch, cfg.block_size, seed=run.seed)  # type: ignore[attr-defined]
    factor, amp = lr_factor(run), dtype != torch.float32
    state = {"step": 0}

    def step() -> float:
        for group in opt.param_groups:
            group["lr"] = run.lr * factor(state["step"])
        x, y = (t.to(device) for t in next(sampler))
        with torch.autocast(device.type, dtype=dtype) if amp else nullcontext():
            logits = model(x)
        loss = lm_loss(logits.float(), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        state["step"] += 1
        return loss.item()

    return step


def measure(case: Case, warmup: int, rounds: int) -> dict:
    """Trainer and plain loop on `case`, timed in alternating rounds (world 1)."""
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, case.vocab, (2**16,), generator=gen)
    corpus = SimpleNamespace(
        train=tokens, val=tokens, vocab=case.vocab, fingerprint="synthetic"
    )
    run = RunConfig(
        steps=10**6,  # the schedule's horizon: the rate barely moves while timed
        batch=case.batch,
        seq=case.seq,
        lr=6e-4,
        preset=case.preset,
        log_every=0,
        quiet=True,
    )
    layout = TrainLayout(dtype=case.dtype)
    trainer = Trainer(layout, run, corpus, resume=False)
    plain = plain_loop(run, corpus, layout.torch_dtype)
    steps = [trainer.step, plain]
    timer = DeviceTimer()
    times: list[list[float]] = [[], []]
    for i in range(warmup + rounds):
        order = (0, 1) if i % 2 == 0 else (1, 0)
        for k in order:
            start = timer.stamp()
            steps[k]()
            if i >= warmup:
                times[k].append(timer.seconds(start, timer.stamp()))
    trainer.close()
    ratios = [a / b for a, b in zip(times[0], times[1], strict=True)]
    ms = [1e3 * statistics.median(t) for t in times]
    tokens_per_step = case.batch * case.seq
    peak = datasheet_peak(runtime.device(), case.dtype)
    flops = model_mod.flops_per_token(trainer.cfg) * tokens_per_step / (ms[0] / 1e3)
    return dict(
        preset=case.preset,
        batch=case.batch,
        seq=case.seq,
        dtype=case.dtype,
        parameters=model_mod.parameters(trainer.cfg),
        trainer_ms=round(ms[0], 3),
        plain_ms=round(ms[1], 3),
        ratio=round(statistics.median(ratios), 4),
        tokens_per_s=round(tokens_per_step / (ms[0] / 1e3), 1),
        mfu=round(flops / peak, 4) if peak else None,
    )


def cases(quick: bool, device: torch.device, dtype: str) -> list[Case]:
    """The presets measured: tiny and gpt2-124m, small on a CPU (a 2-core box runs
    them in seconds), GPT-2's own seq 1024 on a GPU."""
    if device.type == "cpu":
        small = [Case("tiny", 8, 32, dtype, 256), Case("gpt2-124m", 1, 64, dtype)]
        return small[:1] if quick else small
    return [Case("tiny", 64, 256, dtype, 256), Case("gpt2-124m", 8, 1024, dtype)]


def main(argv: list[str]) -> int:
    p = common.parser("trainer", __doc__.splitlines()[0], "the tiny preset only")
    p.add_argument("--dtype", default="float32", help="float32 or bfloat16")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads (default torch's: all cores; 1 on a loaded machine, "
        "where OpenMP's threads wait for each other)",
    )
    args = p.parse_args(argv)
    runtime.init(0, 1, store=dist.HashStore(), host=LOOPBACK, threads=args.threads)
    try:
        device = runtime.device()
        found = [
            measure(c, args.warmup, args.rounds)
            for c in cases(args.quick, device, args.dtype)
        ]
    finally:
        runtime.shutdown()
    result = dict(
        benchmark="trainer",
        device=str(device),
        threads=torch.get_num_threads(),
        table=found,
        ratio=max(r["ratio"] for r in found),
    )
    return common.report(result, args.json, lambda: format_table(found))


def format_table(rows: list[dict]) -> list[str]:
    """One line per case: the two medians, their ratio, tokens/s, MFU."""
    lines = []
    for r in rows:
        mfu = f", MFU {r['mfu']:.2f}" if r["mfu"] is not None else ""
        lines.append(
            f"{r['preset']} ({r['parameters'] / 1e6:.1f}M, batch {r['batch']} x "
            f"{r['seq']}, {r['dtype']}): trainer {r['trainer_ms']:.2f} ms, plain "
            f"{r['plain_ms']:.2f} ms, ratio {r['ratio']:.3f}, "
            f"{r['tokens_per_s']:,.0f} tok/s{mfu}"
        )
    return lines
