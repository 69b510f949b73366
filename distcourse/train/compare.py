"""`--compare`: the trainer's steps against one process training the same steps.

One process builds the same TinyGPT (same seed), the same optimizer and warm-up,
and trains on the same batches (`corpus.batch(step, ...)`). Compared: the loss of
every step, and the first step's gradients (this rank's, gathered to whole tensors
over its TP group, against one process's: the max over every rank). Run it with
SGD first: AdamW's step hides a constant factor on every gradient (chapter 8's
`hybrid.check` says why), SGD's does not; then with AdamW, the optimizer a run
trains with. The one-process run stays on the host.

Tolerances (TOL): float32 sums in another order differ by about 1e-7; chapter 8
measured gradients 4e-8 and losses 5e-7 over layouts of 8 ranks. A gradient
summed instead of averaged over dp is off by its own size (1e-2 and more).
"""

from __future__ import annotations

import torch
from torch import Tensor

from distcourse import checks
from distcourse.examples.gpt import TinyGPT, lm_loss
from distcourse.parallel.hybrid.runner import OPTIMIZERS
from distcourse.train import state as train_state
from distcourse.train.corpus import Corpus
from distcourse.train.layout import TrainLayout
from distcourse.train.trainer import RunConfig, Trainer, warmup_factor

TOL = {"losses": 1e-5, "gradients": 1e-5}


def one_process(
    run: RunConfig, corpus: Corpus, steps: int
) -> tuple[list[float], dict[str, Tensor]]:
    """One process on the host: the loss of each step and step 1's gradients."""
    torch.manual_seed(run.seed)
    model = TinyGPT(run.model(corpus))
    opt = OPTIMIZERS[run.optimizer](model.parameters(), lr=run.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, warmup_factor(run.warmup))
    losses: list[float] = []
    first: dict[str, Tensor] = {}
    for step in range(steps):
        x, y = corpus.batch(step, run.batch, run.seq, run.seed)
        opt.zero_grad()
        loss = lm_loss(model(x), y)
        loss.backward()
        if not first:
            first = {k: p.grad.clone() for k, p in model.named_parameters()}
        opt.step()
        scheduler.step()
        losses.append(loss.item())
    return losses, first


def against_one_process(
    layout: TrainLayout, run: RunConfig, corpus: Corpus, steps: int | None = None
) -> dict:
    """On every rank: `steps` (default run.steps) of the trainer and of one
    process; a dict of losses, alone (one process's), loss_diffs (per step),
    loss_diff (their max) and grad_diff (step 1, max over the world)."""
    steps = run.steps if steps is None else steps
    trainer = Trainer(layout, run, corpus, resume=False)
    grads: dict[str, Tensor] = {}
    try:
        for step in range(steps):
            trainer.step()
            if step == 0:
                params = list(trainer.net.module.parameters())
                values = [
                    p.grad if p.grad is not None else torch.zeros_like(p)
                    for p in params
                ]
                grads = train_state.gather(trainer.net, values)
    finally:
        trainer.close()
    alone, first = one_process(run, corpus, steps)
    worst = max((grads[k].cpu() - first[k]).abs().max().item() for k in grads)
    diffs = [abs(a - b) for a, b in zip(trainer.losses, alone, strict=True)]
    return dict(
        layout=layout.name,
        optimizer=run.optimizer,
        losses=trainer.losses,
        alone=alone,
        loss_diffs=diffs,
        loss_diff=max(diffs),
        grad_diff=checks.max_over_ranks(worst),
    )


def verdicts(found: dict) -> list[str]:
    """The lines `--compare` prints, each ending in a verdict against TOL."""
    steps, opt = len(found["losses"]), found["optimizer"]
    return [
        f"{found['layout']}: gradients of step 1 vs one process "
        f"{checks.verdict(found['grad_diff'], TOL['gradients'])}",
        f"{found['layout']}: losses of {steps} {opt} steps vs one process "
        f"{checks.verdict(found['loss_diff'], TOL['losses'])}",
    ]
