"""Train a TinyGPT on a (dp, pp, tp) mesh, composing chapters 3-10's strategies.

Each rank builds only its own pipeline stages (`build.own_stages`: a model on the
meta device is drawn stage by stage, by name, as one process draws it) and splits
them by tensor parallelism (chapter 4's layers); the other stages are meta twins
whose shapes the pipeline plans with. In torchtitan's order it then checkpoints
each block's activations (`ckpt="full"`, chapter 10) and hands the stages to the
data-parallel axis (`data`: DDP's buckets, ZeRO-1/2's FlatZero, or FSDP; see
`data.py`). A step:

1. the rank takes its data-parallel share of the batch (rows dp_rank * b ...),
   checks its token ids on the host, and cuts it into `accum` chunks (gradient
   accumulation: each chunk's loss / accum);
2. forward and backward of each chunk: chapter 5's Pipeline over the pp group,
   micro-batch by micro-batch, with `schedule` ("1f1b", "gpipe", or
   "interleaved" with `virtual` stages per rank), or the stage directly when
   pp = 1; the TP layers all-reduce over the tp group inside, and agree on
   shapes only when a step meets new ones (then no host sync at all);
3. after the last backward: the gradients averaged over the dp group only (TP
   partners hold different slices; stages different layers): in chapter 3's
   buckets (one all-reduce per ~25 MB, as DDP), or as ZeRO and FSDP reduce them;
4. optionally the gradients clipped to a global norm (one all-reduce of a scalar
   over the world), then the optimizer (AdamW, or plain SGD for checks:
   `OPTIMIZERS`) on what this rank holds.

`dtype=torch.bfloat16` runs each stage under autocast (fp32 weights and
gradients; bf16 matmuls), or with FSDP its MixedPrecisionPolicy. Each replica's
loss is the mean over its share and the shares are equal, so the averaged
gradient is the whole batch's: one process's training, to rounding.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from distcourse import runtime
from distcourse.comm.ledger import Ledger
from distcourse.examples.gpt import TinyGPT, lm_loss
from distcourse.mesh import Mesh
from distcourse.parallel.buckets import Bucket, assign_buckets
from distcourse.parallel.hybrid import build, data
from distcourse.parallel.hybrid.layout import AXES, Layout
from distcourse.parallel.hybrid.layout import check as check_layout
from distcourse.parallel.hybrid.placement import replicated, stage_boxes
from distcourse.parallel.hybrid.stages import parallelize_stage
from distcourse.parallel.hybrid.views import Views
from distcourse.parallel.pipeline import (
    ActivationMeter,
    Pipeline,
    gpipe,
    interleaved,
    one_f_one_b,
)
from distcourse.parallel.tensor import vocab_parallel_cross_entropy
from distcourse.parallel.zero import FlatZero

BUCKET_MB = 25  # torch DDP's default bucket_cap_mb
# AdamW trains; SGD checks: AdamW's step hides a constant gradient scale (check.py)
OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {
    "adamw": torch.optim.AdamW,
    "sgd": torch.optim.SGD,
}
SCHEDULES: dict[str, Callable[..., Any]] = {  # chapter 5's, by name
    "1f1b": one_f_one_b,
    "gpipe": gpipe,
    "interleaved": interleaved,
}


class HybridGPT(Views):
    """This rank's part of a TinyGPT trained on a (dp, pp, tp) `mesh`.

    A collective: every rank of the world constructs it at the same time, from
    the same `model`: a TinyGPT on the host (seed every rank alike) or on the
    meta device with `init(name, tensor)` to draw each parameter. `model` itself
    is not changed; only this rank's stages are copied, to runtime.device().
    `micro_batches` per step feed the pipeline with `schedule` (a name of
    `SCHEDULES`; "interleaved" runs `virtual` stages per rank). `ledger` on
    `step` records the bytes each axis sent in that step (in `self.bytes`).
    `check=False` skips the TP layers' shape agreement even for new shapes.
    `optimizer` names one of `OPTIMIZERS`, stepped with `lr` and `options`
    (e.g. fused=True). `ckpt` "full" checkpoints every block; `data` is a mode
    of `data.MODES`; `dtype` (None: float32) the compute dtype; `accum` chunks
    per step; `clip` a gradient norm to clip to; `meter` counts the activations
    kept for backward without a pipeline (chapter 8; off costs nothing).
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
        virtual: int = 1,
        ckpt: str = "none",
        data_mode: str = "ddp",
        dtype: torch.dtype | None = None,
        accum: int = 1,
        clip: float | None = None,
        init: build.Init | None = None,
        meter: bool = True,
        options: dict[str, Any] | None = None,
    ) -> None:
        for value, names, what in (
            (optimizer, OPTIMIZERS, "optimizer"),
            (schedule, SCHEDULES, "schedule"),
            (data_mode, data.MODES, "data_mode"),
            (ckpt, ("none", "full"), "ckpt"),
        ):
            if value not in names:
                raise ValueError(f"{what}={value!r}: use one of {list(names)}")
        if mesh.names != AXES:
            raise ValueError(f"a hybrid mesh has axes {AXES}, got {mesh.names}")
        if virtual > 1 and schedule != "interleaved":
            raise ValueError(f"virtual={virtual} stages per rank need 'interleaved'")
        self.layout = Layout(*mesh.shape)
        check_layout(
            self.layout, model.cfg, dist.get_world_size(), micro_batches=micro_batches
        )
        self.mesh, self.cfg, self.micro_batches = mesh, model.cfg, micro_batches
        self.data_mode, self.accum, self.clip = data_mode, accum, clip
        self.coord = mesh.coordinate
        pp, tp, dp = self.layout.pp, self.layout.tp, self.layout.dp
        n_stages, self.stage = pp * virtual, self.coord["pp"]
        self.stage_ids = [self.stage + k * pp for k in range(virtual)]
        device = runtime.device()  # the CPU on gloo, this rank's GPU on NCCL
        fsdp_dtype = dtype if data_mode == "fsdp" else None
        twins = build.twins(model, n_stages, fsdp_dtype)
        stages = build.own_stages(model, n_stages, self.stage_ids, device, init)
        firsts = build.first_layers(model.cfg.n_layer, n_stages)
        self.first_layer = firsts[self.stage]
        self.tp_group = tp_group = mesh.group("tp")
        self.boxes = []
        for s in self.stage_ids:
            if tp > 1:
                stages[s] = parallelize_stage(stages[s], tp_group, check=check)
            self.boxes += stage_boxes(
                stages[s], twins[s], firsts[s], model.cfg.n_layer, self.coord["tp"], tp
            )
            if ckpt == "full":
                build.checkpointed(stages[s])
        self.plain = [build.plain(stages[s]) for s in self.stage_ids]
        self.checking = [
            m for st in self.plain for m in st.modules() if hasattr(m, "check")
        ]
        self.check, self.checking_now = check, check
        self.agreed: set[tuple] = set()  # batch shapes the TP groups agreed on
        mine = [stages[s] for s in self.stage_ids]
        self.module: nn.Module = mine[0] if virtual == 1 else nn.ModuleList(mine)
        if data_mode == "fsdp":
            data.shard(mine, mesh["dp"], keep_gathered=ckpt == "full", dtype=dtype)
        self.flat: FlatZero | None = None
        cls, options = OPTIMIZERS[optimizer], dict(options or {}, lr=lr)
        if data_mode in ("zero1", "zero2"):
            self.flat = FlatZero(
                self.module,
                cls,
                int(data_mode[-1]),
                BUCKET_MB,
                mesh.group("dp"),
                **options,
            )
            self.optimizer = self.flat.optimizer
            self.runs: data.Runs | None = data.flat_runs(self.flat, self.boxes)
            self.stepped = list(self.flat.pieces)
        else:
            self.optimizer = cls(self.module.parameters(), **options)
            self.runs, self.stepped = None, list(self.module.parameters())
        self.norm_weights = data.norm_weights(
            data_mode, replicated(self.boxes), tp, dp, self.flat, self.runs
        )
        autocast = dtype is not None and dtype != torch.float32 and data_mode != "fsdp"
        run = {
            s: build.Autocast(stages[s], device.type, dtype) if autocast else stages[s]
            for s in self.stage_ids
        }
        self.loss_fn = self._loss
        self.pipe: Pipeline | None = None
        if pp > 1:
            args = (
                (pp, micro_batches, virtual)
                if schedule == "interleaved"
                else (pp, micro_batches)
            )
            self.pipe = Pipeline(
                [run.get(s, t) for s, t in enumerate(twins)],
                SCHEDULES[schedule](*args),
                self.loss_fn,
                mesh.group("pp"),
                timeout,
                shapes_from=twins,
                inputs="first",
            )
            self.meter: ActivationMeter | None = self.pipe.meter
        else:
            self.meter = ActivationMeter(mine) if meter else None
        self.run, self.running, self.twins = run[self.stage], run, twins
        params = list(self.module.parameters())
        averaged = data_mode == "ddp" and dp > 1  # one replica reduces nothing
        groups = assign_buckets(params, int(BUCKET_MB * 2**20)) if averaged else []
        self.buckets = [
            Bucket(i, [params[j] for j in indices], len(groups))
            for i, indices in enumerate(groups)
        ]
        self.bytes: dict[str, int] = {}
        self.grad_norm: Tensor | None = None

    # ------------------------------------------------------------- a step ------

    def _loss(self, logits: Tensor, y: Tensor) -> Tensor:
        """Mean next-token loss over this chunk, in float32, / accum."""
        logits = logits.float()
        if self.layout.tp > 1:
            loss = vocab_parallel_cross_entropy(
                logits, y, self.tp_group, check=self.checking_now
            )
        else:
            loss = lm_loss(logits, y)
        return loss / self.accum if self.accum > 1 else loss

    def share(self, batch: Tensor) -> Tensor:
        """This rank's data-parallel rows of a whole batch (B, ...): B / dp of them."""
        b = len(batch) // self.layout.dp
        return batch[self.coord["dp"] * b : (self.coord["dp"] + 1) * b]

    def _forward_backward(self, x: Tensor, y: Tensor) -> Tensor | None:
        """Gradients of this chunk's mean loss; the loss on the last stage's ranks."""
        if self.pipe is not None:
            return self.pipe.step(x, y)
        meter = self.meter
        with meter.saving(0) if meter is not None else nullcontext():
            loss = self.loss_fn(self.run(x), y)
        loss.backward()
        if meter is not None:
            meter.release(0)
        return loss.detach()

    def forward_backward(self, x: Tensor, y: Tensor) -> Tensor | None:
        """Steps 1-2 on this rank's share (x, y on the device): every chunk's
        forward and backward, the gradients accumulated; the share's loss on the
        last stage's ranks (a device tensor), None elsewhere."""
        self.agree_on(x)
        if self.meter is not None:
            self.meter.reset()
        if self.flat is not None and self.flat.stage == 1 and self._backwards() > 1:
            self.flat.set_requires_gradient_sync(False)  # one reduce, at the end
        total = None
        for cx, cy in zip(x.chunk(self.accum), y.chunk(self.accum), strict=True):
            loss = self._forward_backward(cx, cy)
            if loss is not None:
                total = loss if total is None else total + loss
        self.agreed.add((tuple(x.shape), x.dtype))
        return total

    def agree_on(self, x: Tensor) -> None:
        """Let the TP layers (and the loss) agree on shapes across their group in
        this step only if its share's shape is new (`check` on): afterwards a TP
        forward sends no descriptor and reads nothing back to the host."""
        self.checking_now = self.check and (tuple(x.shape), x.dtype) not in self.agreed
        for m in self.checking:
            m.check = self.checking_now

    def _backwards(self) -> int:
        """Backward passes per step: one per chunk and micro-batch."""
        return self.accum * (self.micro_batches if self.pipe is not None else 1)

    def step(
        self, x: Tensor, y: Tensor, *, ledger: bool = False, shared: bool = False
    ) -> float:
        """One training step on the whole batch (x, y), given on every rank (or,
        `shared`, this rank's data-parallel share of it); returns the batch's mean
        loss on every rank. With `ledger`, `self.bytes` holds what this rank sent
        per axis: tp (all-reduces inside the layers), pp (activations and
        gradients between stages), dp (gradient all-reduce)."""
        rows = len(x) if shared else len(x) // self.layout.dp
        if not shared:
            check_layout(
                self.layout, None, batch=len(x), micro_batches=self.micro_batches
            )
        if rows % (self.accum * self.micro_batches) or (
            not shared and len(x) % self.layout.dp
        ):
            raise ValueError(
                f"a share of {rows} rows does not split into "
                f"accum={self.accum} x micro_batches={self.micro_batches}"
            )
        if self.layout.tp > 1:  # the split layers do not check ids themselves
            for name, ids in (("inputs", x), ("targets", y)):
                if ids.device.type == "cpu" and ids.numel():  # on the host: no sync
                    low, high = torch.aminmax(ids)
                    if low < 0 or high >= self.cfg.vocab:
                        raise ValueError(
                            f"{name}: token ids must lie in [0, {self.cfg.vocab})"
                        )
        device = runtime.device()
        if not shared:
            x, y = self.share(x), self.share(y)
        x, y = x.to(device), y.to(device)
        self.optimizer.zero_grad(set_to_none=True)
        inside, sync = (
            (Ledger(), Ledger()) if ledger else (nullcontext(), nullcontext())
        )
        with inside:
            loss = self.forward_backward(x, y)
        with sync:
            self.reduce()
        if isinstance(inside, Ledger) and isinstance(sync, Ledger):
            self.bytes = dict(
                dp=sync.bytes_sent("all_reduce"),
                pp=sum(r.wire for r in inside.records if r.kind == "send"),
                tp=inside.bytes_sent("all_reduce"),
            )
        self.optimizer.step()
        return self.mean_loss(loss)

    def reduce(self) -> None:
        """Step 3 and 4's clipping: the gradients as the data-parallel mode leaves
        them after the step's backward passes, then clipped if `clip` is set."""
        if self.data_mode == "ddp" and self.layout.dp > 1:
            self.average_gradients()
        elif self.flat is not None and not self.flat.sync:
            data.reduce_once(self.flat)
        if self.clip is not None:
            self.grad_norm = data.global_norm(self.stepped, self.norm_weights, None)
            grads = [p.grad for p in self.stepped if p.grad is not None]
            data.clip_(grads, self.grad_norm, self.clip)

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

    def mean_loss(self, loss: Tensor | None) -> float:
        """The batch's loss on every rank: the dp replicas' losses averaged. Only the
        last stage has one; its tp ranks hold the same value (a world all-reduce)."""
        if dist.get_world_size() == 1:
            return loss.item()  # type: ignore[union-attr]
        total = torch.zeros(1, dtype=torch.float64, device=runtime.device())
        if loss is not None:
            total += loss.double()
        dist.all_reduce(total)
        return total.item() / (self.layout.dp * self.layout.tp)

    def train(self, batches: list[tuple[Tensor, Tensor]]) -> list[float]:
        """One step per batch; the loss of each."""
        return [self.step(x, y) for x, y in batches]

    def close(self) -> None:
        """Stop the pipeline's sender threads."""
        if self.pipe is not None:
            self.pipe.close()
