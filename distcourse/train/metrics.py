"""What a run measures, every logged step: speed, MFU, memory beside the plan.

- tokens/s: the whole batch's tokens over the mean wall time of the steps since
  the last log (each step ends by reading its loss on the host, so its work is
  done when the clock stops);
- MFU: `model.flops_per_token` x tokens/s over the world's peak, the device's
  datasheet figure for the dtype (bf16; fp32 under TF32 the TF32 figure, else
  plain FP32): `plan.GPUS`' GPUs by name, none on a CPU (no datasheet: null);
- peak memory per rank, measured: on a GPU the CUDA allocator's peak of each
  step (everything alive counted), elsewhere `allocations.PeakMemory` over the
  trainer's construction (what it leaves alive: the rank's stages, flat buffers,
  anything else it built) and its first step (what that allocates at its peak),
  and
  beside it the planner's prediction for the same layout, dtype and optimizer
  (its largest moment for the rank's pipeline stage, `plan.memory.peak`, on the
  rank's device: a datasheet GPU, or the CPU), or null with the planner's reason
  where it refuses the layout.

Rank 0 writes each record as a JSON line (`--metrics PATH`) and to TensorBoard
(`--tensorboard DIR`: scalars loss, eval_loss, lr, tokens_per_s, mfu, the
fullest rank's measured and planned peak). Recording is a collective (the ranks'
peaks are gathered), so every rank records the same steps.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from distcourse import accelerator, plan, runtime
from distcourse.allocations import PeakMemory
from distcourse.examples.gpt import GPTConfig
from distcourse.plan import memory as plan_memory
from distcourse.train.layout import TrainLayout
from distcourse.train.model import flops_per_token
from distcourse.train.state import optimizer_options

# TF32 tensor-core peaks (dense), from the datasheets plan.hardware cites
TF32 = {"h100": 494.7e12, "h200": 494.7e12, "a100": 156e12}


def datasheet_peak(device: torch.device, dtype: str) -> float | None:
    """FLOP/s of one `device` at `dtype` ("float32" or "bfloat16") from its
    datasheet, or None (a CPU; a GPU the planner does not know)."""
    if not accelerator.is_cuda(device):
        return None
    name = torch.cuda.get_device_name(device).lower()
    for gpu, hw in plan.GPUS.items():
        if gpu in name:
            if dtype == "bfloat16":
                return hw.flops_bf16
            tf32 = torch.backends.cuda.matmul.allow_tf32
            return TF32[gpu] if tf32 and gpu in TF32 else hw.flops_fp32
    return None


def policy(layout: TrainLayout, optimizer: str, fused: bool = True) -> plan.DTypePolicy:
    """The planner's dtype policy for the run: "fp32", or "amp-bf16" (fp32
    weights, gradients and optimizer state, bf16 compute: autocast, and FSDP's
    bf16 gathers of fp32 pieces); AdamW as "adamw-fused" where the trainer fuses
    it (`state.optimizer_options`)."""
    dtype = "fp32" if layout.dtype == "float32" else "amp-bf16"
    name = "adamw-fused" if optimizer == "adamw" and fused else optimizer
    return plan.DTypePolicy(dtype, "fp32", name)


def hardware(device: torch.device, world: int) -> plan.Hardware:
    """The planner's machine for `device`: a datasheet GPU by the CUDA device's
    name (an H100 if it is none of them), else this machine's CPU ranks (no
    workspace, CPU kernels: the emulated GPU computes with the CPU's too)."""
    if accelerator.is_cuda(device):
        name = torch.cuda.get_device_name(device).lower()
        return next(
            (hw for gpu, hw in plan.GPUS.items() if gpu in name), plan.GPUS["h100"]
        )
    return plan.local(0.0, 0.0, 1e12, memory=2**40, ranks=world)


def plan_layout(layout: TrainLayout) -> plan.PlanLayout:
    """The planner's name for the trainer's layout."""
    return plan.PlanLayout(
        dp=layout.dp,
        tp=layout.tp,
        pp=layout.pp,
        micro_batches=layout.micro_batches,
        zero=3 if layout.fsdp else layout.zero,
        ckpt=layout.ckpt,
        schedule=layout.schedule,
        virtual=layout.virtual,
        reshard=not (layout.data_mode == "fsdp" and layout.ckpt == "full"),
    )


def planned_bytes(
    layout: TrainLayout,
    cfg: GPTConfig,
    batch: int,
    optimizer: str,
    stage: int,
    hw: plan.Hardware | None = None,
) -> tuple[int | None, str]:
    """(the planner's peak bytes for pipeline rank `stage`: its largest moment,
    `plan.memory.peak`, on `hw` (default: this rank's device, or the CPU
    outside a group), ""), or (None, its reason for refusing the layout)."""
    spec = plan.ModelSpec.from_config(cfg)
    mine = plan_layout(layout)
    device = runtime.device() if dist.is_initialized() else torch.device("cpu")
    hw = hw or hardware(device, layout.world)
    fused = bool(optimizer_options(optimizer, device))
    try:
        plan.check(spec, batch, mine)
        moments = plan_memory.rank_moments(
            spec, batch, policy(layout, optimizer, fused), mine, stage, hw
        )
    except ValueError as err:
        return None, str(err)
    return plan_memory.peak(moments)[1]["total"], ""


def measured_step(
    step: Any, measure: bool, alive: int, held: list
) -> tuple[float, int | None]:
    """Run `step()` (a training step returning its loss); with `measure`, also
    this rank's peak bytes in it: on a GPU the CUDA allocator's (everything
    alive), elsewhere `alive` (the bytes the trainer's construction left alive,
    counted as it was built) + what the step allocates at its peak beyond `held`
    (the tensors alive before it: watched, so a view of a weight is not counted
    again)."""
    device = runtime.device()
    if not measure:
        return step(), None
    if accelerator.is_cuda(device):  # CUDA's allocator counts it all, for free
        torch.cuda.reset_peak_memory_stats(device)
        loss = step()
        return loss, torch.cuda.max_memory_allocated(device)
    with PeakMemory(device, held) as meter:
        loss = step()
    return loss, alive + meter.peak


class Metrics:
    """The records of one run on this rank; rank 0 writes them."""

    def __init__(
        self,
        layout: TrainLayout,
        cfg: GPTConfig,
        batch: int,
        optimizer: str,
        stage: int,
        *,
        path: str | None = None,
        tensorboard: str | None = None,
    ) -> None:
        self.tokens, self.world = batch * cfg.block_size, dist.get_world_size()
        self.flops = flops_per_token(cfg)
        self.peak = datasheet_peak(runtime.device(), layout.dtype)
        self.planned, self.refused = planned_bytes(layout, cfg, batch, optimizer, stage)
        self.rows: list[dict] = []
        self.last_peak: list[int] | None = None
        first = dist.get_rank() == 0
        self.file = None
        if path and first:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self.file = open(path, "a", encoding="utf-8")  # noqa: SIM115 (closed in close)
        self.board = None
        if tensorboard and first:
            from torch.utils.tensorboard import SummaryWriter

            self.board = SummaryWriter(tensorboard)

    def record(
        self, step: int, loss: float, seconds: float, lr: float, **extra: Any
    ) -> dict:
        """One logged step (a collective): `seconds` per step since the last log;
        `extra`: peak (this rank's measured bytes, or None), grad_norm,
        eval_loss."""
        peak = extra.pop("peak", None)
        if peak is not None or self.last_peak is None:
            mine = torch.tensor(
                [-1 if peak is None else peak, self.planned or -1],
                device=runtime.device(),
            )
            every = [torch.zeros_like(mine) for _ in range(self.world)]
            dist.all_gather(every, mine)
            pairs = [e.tolist() for e in every]
            if peak is not None:
                self.last_peak = [p for p, _ in pairs]
            self.planned_all = [q if q >= 0 else None for _, q in pairs]
        speed = self.tokens / seconds if seconds > 0 else float("nan")
        mfu = self.flops * speed / (self.peak * self.world) if self.peak else None
        row = dict(
            step=step,
            loss=loss,
            lr=lr,
            step_ms=1e3 * seconds,
            tokens_per_s=speed,
            mfu=mfu,
            peak_bytes=self.last_peak,
            planned_bytes=self.planned_all,
            planner=self.refused or None,
            **{k: v for k, v in extra.items() if v is not None},
        )
        self.rows.append(row)
        self._write(row)
        return row

    def _write(self, row: dict) -> None:
        if self.file is not None:
            self.file.write(json.dumps(row) + "\n")
            self.file.flush()
        if self.board is not None:
            step = row["step"]
            for name in ("loss", "eval_loss", "lr", "tokens_per_s", "mfu", "grad_norm"):
                if row.get(name) is not None:
                    self.board.add_scalar(name, row[name], step)
            if row["peak_bytes"]:
                self.board.add_scalar("peak_bytes", max(row["peak_bytes"]), step)
            planned = [p for p in row["planned_bytes"] or [] if p is not None]
            if planned:
                self.board.add_scalar("planned_bytes", max(planned), step)

    def close(self) -> None:
        """Flush and close the files."""
        if self.file is not None:
            self.file.close()
        if self.board is not None:
            self.board.close()
