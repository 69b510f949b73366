"""Train a TinyGPT on a (dp, pp, tp) mesh, composing chapters 3-5's strategies.

Each rank builds the same one-process model (same seed), keeps its pipeline stage
(chapter 5's cut) and its tensor-parallel slice of that stage (chapter 4's
layers). A step:

1. the rank takes its data-parallel share of the batch (rows dp_rank * b ...);
2. forward and backward: chapter 5's Pipeline over the pp group, micro-batch by
   micro-batch (or the stage directly when pp = 1); the TP layers all-reduce over
   the tp group inside;
3. after the pipeline's last micro-batch: the gradients averaged over the dp group
   only (TP partners hold different slices; stages different layers), in chapter
   3's buckets (`parallel.buckets`: one flat buffer and one all-reduce per ~25 MB,
   as DDP sends them), all launched before any is awaited;
4. the optimizer (AdamW, or plain SGD for checks: `OPTIMIZERS`) on the parameters
   this rank holds.

Each replica's loss is the mean over its share and the shares are equal, so the
averaged gradient is the whole batch's: one process's training, to rounding.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch import Tensor

from distcourse import runtime
from distcourse.comm.ledger import Ledger
from distcourse.examples.gpt import TinyGPT, lm_loss
from distcourse.mesh import Mesh
from distcourse.parallel.buckets import Bucket, assign_buckets
from distcourse.parallel.hybrid.layout import AXES, Layout
from distcourse.parallel.hybrid.layout import check as check_layout
from distcourse.parallel.hybrid.stages import (
    bounds,
    one_process_state,
    parallelize_stage,
    stages,
)
from distcourse.parallel.pipeline import ActivationMeter, Pipeline, gpipe, one_f_one_b
from distcourse.parallel.tensor import vocab_parallel_cross_entropy

BUCKET_MB = 25  # torch DDP's default bucket_cap_mb
# AdamW trains; SGD checks: AdamW's step hides a constant gradient scale (check.py)
OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {
    "adamw": torch.optim.AdamW,
    "sgd": torch.optim.SGD,
}
SCHEDULES = {"1f1b": one_f_one_b, "gpipe": gpipe}  # chapter 5's, by name


class HybridGPT:
    """This rank's part of a TinyGPT trained on a (dp, pp, tp) `mesh`.

    A collective: every rank of the world constructs it at the same time, from
    the same `model` (seed every rank alike). `model` itself is not changed; the
    stage is copied to the rank's device (runtime.device()), batches too.
    `micro_batches` per step feed the pipeline with `schedule` (a name of
    `SCHEDULES`: "1f1b", the default, or "gpipe"). `ledger` on `step` records
    the bytes each axis sent in that step (in `self.bytes`). `check=False` skips
    the TP layers' shape agreement before each forward (one small all_gather each).
    `optimizer` names one of `OPTIMIZERS` ("adamw" or "sgd"), stepped with `lr`.
    """

    def __init__(
        self,
        model: TinyGPT,
        mesh: Mesh,
        *,
        micro_batches: int = 1,
        lr: float = 1e-2,
        optimizer: str = "adamw",
        timeout: float = runtime.DEFAULT_TIMEOUT,
        check: bool = True,
        schedule: str = "1f1b",
    ) -> None:
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer={optimizer!r}: use one of {list(OPTIMIZERS)}")
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule={schedule!r}: use one of {list(SCHEDULES)}")
        if mesh.names != AXES:
            raise ValueError(f"a hybrid mesh has axes {AXES}, got {mesh.names}")
        self.layout = Layout(*mesh.shape)
        world = dist.get_world_size()
        check_layout(self.layout, model.cfg, world, micro_batches=micro_batches)
        self.mesh, self.cfg, self.micro_batches = mesh, model.cfg, micro_batches
        self.coord = mesh.coordinate
        pp, tp = self.layout.pp, self.layout.tp
        self.stage = self.coord["pp"]
        device = runtime.device()  # the CPU on gloo, this rank's GPU on NCCL
        full = [s.to(device) for s in stages(model, pp)]  # every stage, whole
        self.first_layer = bounds(model.cfg.n_layer, pp)[self.stage]
        mine = full[self.stage]
        tp_group = mesh.group("tp")
        if tp > 1:
            mine = parallelize_stage(mine, tp_group, check=check)
            self.loss_fn: Callable[[Tensor, Tensor], Tensor] = lambda logits, y: (
                vocab_parallel_cross_entropy(logits, y, tp_group, check=check)
            )
        else:
            self.loss_fn = lm_loss
        self.module = mine
        self.pipe: Pipeline | None = None
        if pp > 1:
            placed = [mine if s == self.stage else f for s, f in enumerate(full)]
            self.pipe = Pipeline(
                placed,
                SCHEDULES[schedule](pp, micro_batches),
                self.loss_fn,
                mesh.group("pp"),
                timeout,
                shapes_from=full,
            )
            self.meter = self.pipe.meter
        else:
            self.meter = ActivationMeter([mine])
        self.optimizer = OPTIMIZERS[optimizer](mine.parameters(), lr=lr)
        self.moments = 2 if optimizer == "adamw" else 0  # state tensors per parameter
        params = list(mine.parameters())
        groups = assign_buckets(params, int(BUCKET_MB * 2**20))
        self.buckets = [
            Bucket(i, [params[j] for j in indices], len(groups))
            for i, indices in enumerate(groups)
        ]
        self.bytes: dict[str, int] = {}

    def share(self, batch: Tensor) -> Tensor:
        """This rank's data-parallel rows of a whole batch (B, ...): B / dp of them."""
        b = len(batch) // self.layout.dp
        return batch[self.coord["dp"] * b : (self.coord["dp"] + 1) * b]

    def _forward_backward(self, x: Tensor, y: Tensor) -> Tensor | None:
        """Gradients of this share's mean loss; the loss on the last stage's ranks."""
        if self.pipe is not None:
            return self.pipe.step(x, y)
        self.meter.reset()
        with self.meter.saving(0):
            loss = self.loss_fn(self.module(x), y)
        loss.backward()
        self.meter.release(0)
        return loss.detach()

    def step(self, x: Tensor, y: Tensor, *, ledger: bool = False) -> float:
        """One training step on the whole batch (x, y), given on every rank; returns
        the batch's mean loss on every rank. With `ledger`, `self.bytes` holds what
        this rank sent per axis: tp (all-reduces inside the layers), pp (activations
        and gradients between stages), dp (gradient all-reduce)."""
        check_layout(self.layout, None, batch=len(x), micro_batches=self.micro_batches)
        device = runtime.device()
        x, y = self.share(x).to(device), self.share(y).to(device)
        self.optimizer.zero_grad(set_to_none=True)
        inside, sync = Ledger(), Ledger()
        with inside if ledger else nullcontext():
            loss = self._forward_backward(x, y)
        with sync if ledger else nullcontext():
            if self.layout.dp > 1:
                self.average_gradients()
        if ledger:
            self.bytes = dict(
                dp=sync.bytes_sent("all_reduce"),
                pp=sum(r.wire for r in inside.records if r.kind == "send"),
                tp=inside.bytes_sent("all_reduce"),
            )
        self.optimizer.step()
        return self._mean_loss(loss)

    def average_gradients(self) -> None:
        """Each gradient / dp into its bucket; every bucket's all-reduce launched over
        the dp group, in the same order on every rank; then the sums copied back.
        Called by `step` after the last micro-batch when dp > 1 (a subclass that
        changes it plants a fault for the negative controls)."""
        dp = self.mesh.group("dp")
        for bucket in self.buckets:
            for slot, param in enumerate(bucket.params):
                torch.div(param.grad, self.layout.dp, out=bucket.view(slot))
            bucket.launch(dp)
        for bucket in self.buckets:
            bucket.wait()
            for slot, param in enumerate(bucket.params):
                param.grad.copy_(bucket.view(slot))

    def _mean_loss(self, loss: Tensor | None) -> float:
        """The batch's loss on every rank: the dp replicas' losses averaged. Only the
        last stage has one; its tp ranks hold the same value (a world all-reduce)."""
        total = torch.zeros(1, dtype=torch.float64, device=runtime.device())
        if loss is not None:
            total += loss.double()
        dist.all_reduce(total)
        return total.item() / (self.layout.dp * self.layout.tp)

    def train(self, batches: list[tuple[Tensor, Tensor]]) -> list[float]:
        """One step per batch; the loss of each."""
        return [self.step(x, y) for x, y in batches]

    def one_process_state(self) -> dict[str, Tensor]:
        """The full parameters of this rank's stage under TinyGPT's names (its TP
        group gathers the slices: every rank calls it)."""
        return one_process_state(self.module, self.first_layer, self.cfg.n_layer)

    def one_process_grads(self) -> dict[str, Tensor]:
        """The gradients of this rank's stage as `one_process_state` gives the
        parameters: whole tensors under TinyGPT's names (a collective over the tp
        group). Read after a `step`, they are that step's averaged gradients."""
        params = list(self.module.parameters())
        saved = [p.detach().clone() for p in params]
        with torch.no_grad():
            for p in params:
                p.copy_(p.grad if p.grad is not None else torch.zeros_like(p))
        try:
            return {k: v.clone() for k, v in self.one_process_state().items()}
        finally:
            with torch.no_grad():
                for p, value in zip(params, saved, strict=True):
                    p.copy_(value)

    def held(self) -> dict[str, int]:
        """Bytes this rank holds after a step: parameters, gradients, the
        optimizer's state (AdamW's two moments; none for plain SGD), and the
        activations kept for backward at the step's peak."""
        params = sum(p.numel() * p.element_size() for p in self.module.parameters())
        return dict(
            params=params,
            grads=params,
            optimizer=self.moments * params,
            activations=self.meter.peak,
        )

    def close(self) -> None:
        """Stop the pipeline's sender threads."""
        if self.pipe is not None:
            self.pipe.close()
