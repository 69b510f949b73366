"""Chapter 13's trainer: a TinyGPT learns the book's text on any accepted layout.

Every rank of the world builds a `Trainer` at the same time. It checks the layout
(`layout.check`, the same refusals the script makes before torchrun starts),
builds the (dp, pp, tp) mesh, and either resumes from the newest complete
checkpoint in `run.ckpt_dir` or seeds a fresh model (the same on every rank).
Step s trains on `corpus.batch(s, ...)`, so the data position is the step: a
resumed run reads what an uninterrupted one would, and its losses are the same
(bit for bit on CPU, same layout; see `checkpoint` for another layout).

The learning rate warms up linearly over `run.warmup` steps (a LambdaLR, saved
with the checkpoint), then stays at `run.lr`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
from torch.optim.lr_scheduler import LambdaLR

from distcourse import runtime
from distcourse.examples.gpt import GPTConfig, TinyGPT
from distcourse.parallel.hybrid import make_mesh
from distcourse.train import checkpoint, fault
from distcourse.train import state as train_state
from distcourse.train.corpus import Corpus
from distcourse.train.layout import TrainLayout, check
from distcourse.train.progress import Progress, held_per_rank


@dataclass(frozen=True)
class RunConfig:
    """A run's settings besides its layout: `steps` in all (a resumed run goes on
    to the same total), the global `batch` of sequences of `seq` characters, the
    optimizer ("sgd" or "adamw") and its `lr`, `warmup` steps, the `seed` of the
    model and the data, the model's size, and checkpoints every `ckpt_every`
    steps into `ckpt_dir` (none without it)."""

    steps: int = 20
    batch: int = 8
    seq: int = 32
    lr: float = 1e-2
    optimizer: str = "adamw"
    warmup: int = 0
    seed: int = 0
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 32
    ckpt_dir: str | None = None
    ckpt_every: int = 0
    quiet: bool = False

    def model(self, corpus: Corpus) -> GPTConfig:
        """TinyGPT's configuration for `corpus`'s vocabulary and `seq`."""
        return GPTConfig(
            vocab=corpus.vocab,
            block_size=self.seq,
            n_layer=self.n_layer,
            n_head=self.n_head,
            n_embd=self.n_embd,
        )


def warmup_factor(warmup: int) -> Callable[[int], float]:
    """LambdaLR's factor: (s + 1) / warmup for the first `warmup` steps, then 1."""
    return lambda s: min(1.0, (s + 1) / warmup) if warmup > 0 else 1.0


class Trainer:
    """This rank's part of a run (a collective: every rank constructs it).

    `resume` loads the newest complete checkpoint of `run.ckpt_dir`, if any; it
    must have been written for the same corpus, model, optimizer, seed, batch,
    rate and warm-up (`identity`), on any layout: a ValueError names the first
    that differs. `kill_at` (a step, from 1) kills this rank with SIGKILL in
    that step's forward pass (`fault`, chapter 13's drill).
    """

    def __init__(
        self,
        layout: TrainLayout,
        run: RunConfig,
        corpus: Corpus,
        *,
        resume: bool = True,
        kill_at: int | None = None,
    ) -> None:
        self.layout, self.run, self.corpus = layout, run, corpus
        self.kill_at = kill_at  # `fault`: this rank dies in step kill_at's forward
        self.cfg = run.model(corpus)
        check(layout, self.cfg, dist.get_world_size(), run.batch)
        self.mesh = make_mesh(layout.grid, self.cfg)
        found = checkpoint.latest(run.ckpt_dir) if run.ckpt_dir and resume else None
        snap = checkpoint.read(found) if found is not None else None
        if snap is not None:
            self._agree(snap.meta)
            model = TinyGPT(self.cfg)
            model.load_state_dict(snap.model)
        else:
            torch.manual_seed(run.seed)  # the same model on every rank
            model = TinyGPT(self.cfg)
        self.net: train_state.Net = train_state.build(
            layout, model, self.mesh, optimizer=run.optimizer, lr=run.lr
        )
        self.scheduler = LambdaLR(self.net.optimizer, warmup_factor(run.warmup))
        self.start, self.losses = 0, []
        if snap is not None:
            train_state.set_moments(self.net, snap.meta["adam_step"], snap.moments)
            self.scheduler.load_state_dict(snap.meta["scheduler"])
            for group, lr in zip(
                self.net.optimizer.param_groups,
                self.scheduler.get_last_lr(),
                strict=True,
            ):
                group["lr"] = lr
            torch.set_rng_state(snap.rng)
            if snap.cuda_rng is not None and runtime.device().type == "cuda":
                torch.cuda.set_rng_state(snap.cuda_rng)
            self.start, self.losses = snap.step, list(snap.meta["losses"])
        self.step_no = self.start
        self.progress: Progress | None = None  # the last `fit`'s bar

    def _agree(self, meta: dict) -> None:
        """ValueError if a checkpoint was written for another corpus or model."""
        mine = self.identity()
        for key, value in mine.items():
            if meta.get(key) != value:
                raise ValueError(
                    f"checkpoint {key} is {meta.get(key)!r}, this run's is {value!r}"
                )

    def identity(self) -> dict:
        """What a checkpoint must share with the run that resumes it."""
        return dict(
            corpus=self.corpus.fingerprint,
            model=asdict(self.cfg),
            optimizer=self.run.optimizer,
            seed=self.run.seed,
            batch=self.run.batch,
            lr=self.run.lr,  # the scheduler's saved base rate would override it
            warmup=self.run.warmup,
        )

    def step(self) -> float:
        """Train one step on the next batch; its mean loss on every rank."""
        run = self.run
        x, y = self.corpus.batch(self.step_no, run.batch, run.seq, run.seed)
        if self.kill_at == self.step_no + 1:
            fault.kill_in_forward(self.net.module)
        loss = self.net.step(x, y)
        self.scheduler.step()
        self.step_no += 1
        self.losses.append(loss)
        return loss

    def save(self, *, after_write: Callable[[], None] | None = None) -> None:
        """Checkpoint the run after its current step into `run.ckpt_dir`."""
        if not self.run.ckpt_dir:
            raise ValueError("no ckpt_dir: this run does not checkpoint")
        meta = dict(
            self.identity(),
            layout=self.layout.name,
            world=dist.get_world_size(),
            scheduler=self.scheduler.state_dict(),
            losses=self.losses,
        )
        checkpoint.save(
            self.run.ckpt_dir, self.step_no, self.net, meta, after_write=after_write
        )

    def fit(self, until: int | None = None) -> list[float]:
        """Train up to step `until` (default: run.steps), checkpointing every
        `run.ckpt_every` steps; the losses of every step so far (resumed ones
        too). A progress bar on rank 0 of a terminal (not with run.quiet)."""
        until = self.run.steps if until is None else until
        self.progress = bar = Progress(self.step_no, until, quiet=self.run.quiet)
        tokens = self.run.batch * self.run.seq
        try:
            while self.step_no < until:
                began = time.perf_counter()
                loss = self.step()
                seconds = time.perf_counter() - began
                held = held_per_rank(sum(self.net.held().values()))
                bar.update(loss, tokens / seconds, held)
                every = self.run.ckpt_every
                if self.run.ckpt_dir and every and self.step_no % every == 0:
                    self.save()
        finally:
            bar.close()
        return self.losses

    def close(self) -> None:
        """Stop the pipeline's threads."""
        self.net.close()
