"""Chapter 13's trainer: a GPT learns a corpus on any accepted layout.

Every rank of the world builds a `Trainer` at the same time. It checks the layout
(`layout.check`, the same refusals the script makes before torchrun starts),
builds the (dp, pp, tp) mesh with the run's timeout, and its part of the model
(`state.build`: its own stages only, drawn by name), then either resumes from the
newest complete checkpoint in `run.ckpt_dir` or starts afresh. The sampler reads
this rank's data-parallel rows of each step's batch (`sampler.Sampler`); its
state, the next step, is in the checkpoint, so a resumed run reads what an
uninterrupted one would, and its losses are the same (bit for bit on a CPU, same
layout; see `checkpoint` for another layout).

The learning rate warms up linearly over `run.warmup` steps, then decays along a
cosine to `run.min_lr` x lr at `run.steps` (a LambdaLR, saved with the
checkpoint). Gradients are clipped to `run.clip` (global norm) when it is set.
Every `run.eval_every` steps the loss of `run.eval_batches` fixed held-out
batches is measured; every `run.log_every` steps a `metrics.Metrics` record is
written.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
from torch.optim.lr_scheduler import LambdaLR

from distcourse import accelerator, runtime
from distcourse.allocations import PeakMemory
from distcourse.examples.gpt import GPTConfig
from distcourse.mesh import Mesh
from distcourse.parallel.hybrid import make_mesh
from distcourse.train import checkpoint, fault
from distcourse.train import model as model_mod
from distcourse.train import state as train_state
from distcourse.train.layout import TrainLayout, check
from distcourse.train.metrics import Metrics, measured_step
from distcourse.train.progress import Progress
from distcourse.train.sampler import Sampler, held_out


@dataclass(frozen=True)
class RunConfig:
    """A run's settings besides its layout: the model (`preset`, each size
    overridden where given; `seq` None is the preset's), `steps` in all (a
    resumed run goes on to the same total), the global `batch` of sequences, the
    optimizer ("sgd" or "adamw") and its `lr` with `warmup` and cosine decay to
    `min_lr` x lr, `clip` (a global gradient norm, or None), the `seed` of the
    model and the data, checkpoints every `ckpt_every` steps into `ckpt_dir`
    keeping the newest `keep` (0: all), the eval loss every `eval_every` steps
    over `eval_batches` held-out batches, a metrics record every `log_every`
    steps (to `metrics` as JSON lines, to `tensorboard`), the group `timeout`."""

    steps: int = 20
    batch: int = 8
    seq: int | None = None
    lr: float = 1e-2
    optimizer: str = "adamw"
    warmup: int = 0
    min_lr: float = 0.1
    clip: float | None = None
    seed: int = 0
    preset: str = "tiny"
    n_layer: int | None = None
    n_head: int | None = None
    n_embd: int | None = None
    ckpt_dir: str | None = None
    ckpt_every: int = 0
    keep: int = 0
    eval_every: int = 0
    eval_batches: int = 2
    log_every: int = 1
    metrics: str | None = None
    tensorboard: str | None = None
    timeout: float = runtime.DEFAULT_TIMEOUT
    quiet: bool = False

    def model(self, corpus: object) -> GPTConfig:
        """The model's shape for `corpus`'s vocabulary (`model.config`)."""
        return model_mod.config(
            self.preset,
            corpus.vocab,  # type: ignore[attr-defined]
            n_layer=self.n_layer,
            n_embd=self.n_embd,
            n_head=self.n_head,
            seq=self.seq,
        )


def lr_factor(run: RunConfig) -> Callable[[int], float]:
    """LambdaLR's factor after s steps: (s + 1) / warmup during the warm-up, then
    a cosine from 1 down to run.min_lr at run.steps (flat after)."""

    def factor(s: int) -> float:
        if s < run.warmup:
            return (s + 1) / run.warmup
        span = max(1, run.steps - run.warmup)
        done = min(1.0, (s - run.warmup) / span)
        return run.min_lr + (1 - run.min_lr) * 0.5 * (1 + math.cos(math.pi * done))

    return factor


class Trainer:
    """This rank's part of a run (a collective: every rank constructs it).

    `resume` loads the newest complete checkpoint of `run.ckpt_dir`, if any; it
    must have been written for the same corpus, model, optimizer, seed, batch,
    rate and schedule (`identity`), on any layout: a ValueError names the first
    that differs. `kill_at` (a step, from 1) kills this rank with SIGKILL in
    that step's forward pass (`fault`, chapter 13's drill). `mesh`: the
    layout's (dp, pp, tp) mesh if one was built already (made here otherwise).
    """

    def __init__(
        self,
        layout: TrainLayout,
        run: RunConfig,
        corpus: object,
        *,
        resume: bool = True,
        kill_at: int | None = None,
        mesh: Mesh | None = None,
    ) -> None:
        self.layout, self.run, self.corpus = layout, run, corpus
        self.kill_at = kill_at
        self.cfg = cfg = run.model(corpus)
        check(layout, cfg, dist.get_world_size(), run.batch)
        self.mesh = mesh or make_mesh(layout.grid, cfg, timeout=run.timeout)
        dp, rank, seq = layout.dp, self.mesh.coordinate["dp"], cfg.block_size
        self.sampler = Sampler(
            corpus.train,  # type: ignore[attr-defined]
            run.batch,
            seq,
            seed=run.seed,
            dp=dp,
            rank=rank,
        )
        self.held = []
        if run.eval_every:
            val = corpus.val  # type: ignore[attr-defined]
            self.held = held_out(val, run.eval_batches, run.batch, seq, dp, rank)
        self.start, self.losses, self.evals = 0, [], {}
        device = runtime.device()
        counter = nullcontext() if accelerator.is_cuda(device) else PeakMemory(device)
        with counter:  # what building (and resuming) leaves alive, on a CPU
            self._build(resume)
        self.alive = counter.end if isinstance(counter, PeakMemory) else 0
        self.step_no = self.start
        self.metrics = Metrics(
            layout,
            cfg,
            run.batch,
            run.optimizer,
            self.net.stage,
            path=run.metrics,
            tensorboard=run.tensorboard,
        )
        self.progress: Progress | None = None  # the last `fit`'s bar

    def _build(self, resume: bool) -> None:
        """The model on this rank and its schedule; then the newest checkpoint's
        state, if resuming."""
        run = self.run
        self.net = train_state.build(
            self.layout,
            self.cfg,
            self.mesh,
            optimizer=run.optimizer,
            lr=run.lr,
            seed=run.seed,
            clip=run.clip,
            timeout=run.timeout,
        )
        self.scheduler = LambdaLR(self.net.optimizer, lr_factor(run))
        found = checkpoint.latest(run.ckpt_dir) if run.ckpt_dir and resume else None
        if found is not None:
            self._resume(found)

    def _resume(self, found: object) -> None:
        """Everything a checkpoint holds, back in place."""
        meta = checkpoint.meta_of(found)  # type: ignore[arg-type]
        for key, value in self.identity().items():
            saved = meta.get(key)
            if saved != value:
                raise ValueError(
                    f"checkpoint {key} is {saved!r}, this run's is {value!r}"
                )
        snap = checkpoint.load(found, self.net)  # type: ignore[arg-type]
        self.scheduler.load_state_dict(snap.meta["scheduler"])
        for group, lr in zip(
            self.net.optimizer.param_groups, self.scheduler.get_last_lr(), strict=True
        ):
            group["lr"] = lr
        self.sampler.load_state_dict(snap.meta["sampler"])
        if snap.rng is not None:
            torch.set_rng_state(snap.rng)
        if accelerator.is_gpu(runtime.device()):
            accelerator.set_rng_state(snap.cuda_rng, runtime.device())
        self.start, self.losses = snap.step, list(snap.meta["losses"])
        self.evals = {int(k): v for k, v in snap.meta.get("evals", {}).items()}

    def identity(self) -> dict:
        """What a checkpoint must share with the run that resumes it."""
        run = self.run
        return dict(
            corpus=self.corpus.fingerprint,  # type: ignore[attr-defined]
            model=asdict(self.cfg),
            optimizer=run.optimizer,
            seed=run.seed,
            batch=run.batch,
            lr=run.lr,  # the scheduler's saved base rate would override it
            warmup=run.warmup,
            min_lr=run.min_lr,
            decay=run.steps if run.min_lr < 1 else None,  # the cosine's length
        )

    def step(self) -> float:
        """Train one step on the next batch; its mean loss on every rank."""
        x, y = next(self.sampler)
        if self.kill_at == self.step_no + 1:
            fault.kill_in_forward(self.net.module)
        self.lr = self.scheduler.get_last_lr()[0]  # this step's rate
        loss = self.net.step(x, y, shared=True)
        self.scheduler.step()
        self.step_no += 1
        self.losses.append(loss)
        return loss

    def evaluate(self) -> float:
        """The mean loss of the held-out batches (every rank; no gradients)."""
        device = runtime.device()
        total = sum(self.net.evaluate(x.to(device), y.to(device)) for x, y in self.held)
        return total / len(self.held)

    def save(self, *, after_write: Callable[[], None] | None = None) -> None:
        """Checkpoint the run after its current step into `run.ckpt_dir`."""
        if not self.run.ckpt_dir:
            raise ValueError("no ckpt_dir: this run does not checkpoint")
        meta = dict(
            self.identity(),
            layout=self.layout.name,
            world=dist.get_world_size(),
            scheduler=self.scheduler.state_dict(),
            sampler=self.sampler.state_dict(),
            losses=self.losses,
            evals=self.evals,
        )
        checkpoint.save(
            self.run.ckpt_dir,
            self.step_no,
            self.net,
            meta,
            keep=self.run.keep,
            after_write=after_write,
        )

    def fit(self, until: int | None = None, *, profiler: object = None) -> list[float]:
        """Train up to step `until` (default: run.steps), with the eval loss,
        metrics and checkpoints at their intervals; the losses of every step so
        far (resumed ones too). A progress bar on rank 0 of a terminal (not with
        run.quiet). `profiler` (a torch.profiler.profile) is stepped each step."""
        run = self.run
        until = run.steps if until is None else until
        self.progress = bar = Progress(self.step_no, until, quiet=run.quiet)
        since, busy = 0, 0.0
        try:
            while self.step_no < until:
                # a CPU counts the trainer's first step only (every operator is
                # seen: slow); CUDA's allocator counts every step for free
                measure = self.step_no == self.start or accelerator.is_cuda(
                    runtime.device()
                )
                began = time.perf_counter()
                measure = measure and self._logs(self.step_no + 1)
                held = self.net.tensors() if measure else []
                loss, peak = measured_step(self.step, measure, self.alive, held)
                busy += time.perf_counter() - began
                since += 1
                if profiler is not None:
                    profiler.step()  # type: ignore[attr-defined]
                s = self.step_no
                eval_loss = None
                if run.eval_every and (s % run.eval_every == 0 or s == until):
                    eval_loss = self.evals[s] = self.evaluate()
                if self._logs(s) or eval_loss is not None:
                    seconds = busy / since
                    norm = self.net.grad_norm
                    row = self.metrics.record(
                        s,
                        loss,
                        seconds,
                        self.lr,
                        peak=peak,
                        grad_norm=None if norm is None else norm.item(),
                        eval_loss=eval_loss,
                    )
                    bar.update(row, since)
                    since, busy = 0, 0.0
                if run.ckpt_dir and run.ckpt_every and s % run.ckpt_every == 0:
                    self.save()
        finally:
            bar.close()
        return self.losses

    def _logs(self, s: int) -> bool:
        """Whether step s writes a metrics record."""
        return (
            s == 1
            or (self.run.log_every > 0 and s % self.run.log_every == 0)
            or s == self.run.steps
        )

    def close(self) -> None:
        """Stop the pipeline's threads and close the metrics files."""
        self.net.close()
        self.metrics.close()
