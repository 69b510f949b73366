"""A training step's memory measured as `plan.memory` predicts it: phase by phase
(what a GPU's allocator reports), and on the CPU over time by kind.

`measure(cfg, batch, policy, device)` trains TinyGPT(cfg) for `WARMUP` steps (so
AdamW's state exists) and measures the next one, every number in bytes above what
was allocated before the model existed (as `tests/data/gpu_measurements.json`
holds them):

    state          held before the step: weights, optimizer state, cuBLAS's
                   workspace, the batch
    forward        after the model's forward (its logits alive)
    loss           after the loss (the logits dropped)
    forward_peak   the most during forward and loss
    loss_peak      the most during the loss's backward (until the logits'
                   gradient exists: the loss region's moment)
    backward_peak  the most during backward
    gradients      held after backward
    step_peak      the most during the optimizer's step
    peak           the most of the three
    activations    what the forward and its loss keep for backward (saved-tensor
                   hooks, each storage once, parameters aside; a second forward,
                   after the peaks: the identity pack hook keeps saved outputs in
                   a reference cycle until the garbage collector runs)

Counters: on a GPU the allocator's (`allocations.PeakMemory`:
`max_memory_allocated` after `reset_peak_memory_stats`); on the CPU
`PeakMemory`'s own count of every operator's outputs (the batch, made before the
model, is left out of the state and counted among the activations, as the planner
counts the token ids). Policies: "fp32", and
"amp-bf16" (fp32 weights under `torch.autocast(device, bfloat16)`); the optimizer
is `torch.optim.AdamW`, fused for "adamw-fused", torch's default otherwise.

`step_seconds(...)` times the step (the median of `TIMED` after `WARMUP + 1`
warm-ups, each on the device's clock: CUDA events on a GPU).

`python -m distcourse.plan.phases [--append FILE] [--quick]` measures `ROWS` (the
shapes measured on one H200, 2026-12-04) on this machine's GPU, or on the CPU a
small shape with --quick, prints each row beside the planner's prediction for
this GPU (`Hardware` from its name, or an H100's figures), and appends the rows
to FILE (`tests/data/gpu_measurements.json`, as `tools/gpu_check.sh` does).

`timeline(cfg, batch, policy)` (CPU only) runs the same step under a counter that
keeps every storage's birth and death, and returns the bytes alive after each
operator by kind: parameters, optimizer (its state), gradients (the
.grad tensors backward leaves), activations (the batch, and what forward or the
loss make that is alive when the loss is done), loss (the logits, and what the
loss and its backward make until the logits' gradient exists), temporaries (the
rest: forward's and backward's intermediates, the optimizer's), with the operator
index at which each phase begins.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import statistics
import sys
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from distcourse import clock
from distcourse.allocations import PeakMemory
from distcourse.examples.gpt import GPTConfig, TinyGPT, lm_loss
from distcourse.parallel.tensor.memory import step_activation_bytes
from distcourse.plan.hardware import GPUS, Hardware
from distcourse.plan.prediction import predict
from distcourse.plan.spec import DTypePolicy, ModelSpec, PlanLayout

WARMUP = 2
TIMED = 8
PHASES = ("forward", "loss", "backward", "step")
TIMELINE_KINDS = (
    "parameters",
    "optimizer",
    "gradients",
    "activations",
    "loss",
    "temporaries",
)
POLICIES = ("fp32", "amp-bf16")
# (layers, hidden, heads, seq, vocab), batch, policy: what one H200 measured
ROWS = (
    ((12, 768, 12, 1024, 32000), 8, "fp32"),
    ((12, 768, 12, 1024, 32000), 8, "amp-bf16"),
    ((24, 2048, 16, 2048, 32000), 4, "amp-bf16"),
    ((24, 2048, 16, 2048, 32000), 4, "fp32"),
)
QUICK = (((2, 256, 4, 32, 32000), 2, "fp32"), ((2, 256, 4, 32, 32000), 2, "amp-bf16"))


def build(
    cfg: GPTConfig, policy: str, optimizer: str, device: torch.device
) -> tuple[nn.Module, torch.optim.Optimizer]:
    """TinyGPT(cfg) on `device` (seeded) and its AdamW."""
    if policy not in POLICIES:
        raise ValueError(f"measured policies are {', '.join(POLICIES)}, not {policy!r}")
    torch.manual_seed(0)
    model = TinyGPT(cfg).to(device)
    fused = True if optimizer == "adamw-fused" else None
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused)


def batch_of(cfg: GPTConfig, batch: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Random token ids and targets (batch, seq), drawn on the host."""
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, cfg.vocab, (2, batch, cfg.block_size), generator=gen)
    return x.to(device), y.to(device)


def one_step(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    x: Tensor,
    y: Tensor,
    amp: bool,
    mark: Callable[[str], None] = lambda phase: None,
) -> None:
    """A training step, `mark(phase)` called as each phase begins."""
    opt.zero_grad(set_to_none=True)
    mark("forward")
    with torch.autocast(x.device.type, torch.bfloat16, enabled=amp):
        logits = model(x)
        mark("loss")
        loss = lm_loss(logits, y)
    del logits
    mark("backward")
    loss.backward()
    mark("step")
    opt.step()


def measure(
    cfg: GPTConfig,
    batch: int,
    policy: str = "fp32",
    device: torch.device | str = "cpu",
    optimizer: str = "adamw-fused",
) -> dict[str, int]:
    """The step's bytes by phase (module docstring)."""
    device = torch.device(device)
    amp = policy == "amp-bf16"
    x, y = batch_of(cfg, batch, device)
    out: dict[str, int] = {}
    with PeakMemory(device, held=[x, y]) as meter:
        model, opt = build(cfg, policy, optimizer, device)
        for _ in range(WARMUP):
            one_step(model, opt, x, y, amp)
        opt.zero_grad(set_to_none=True)
        out["state"] = meter.sample() if meter.counted_here else _allocated(meter)
        meter.restart()
        with torch.autocast(device.type, torch.bfloat16, enabled=amp):
            logits = model(x)
            out["forward"] = _now(meter)
            loss = lm_loss(logits, y)
        logits.register_hook(lambda grad: out.update(loss_peak=_peak(meter)))
        del logits
        out["loss"], out["forward_peak"] = _now(meter), _peak(meter)
        meter.restart()
        loss.backward()
        out["backward_peak"], out["gradients"] = _peak(meter), _now(meter)
        meter.restart()
        opt.step()
        out["step_peak"] = _peak(meter)
    out["peak"] = max(out[k] for k in ("forward_peak", "backward_peak", "step_peak"))
    with torch.autocast(device.type, torch.bfloat16, enabled=amp):
        out["activations"] = step_activation_bytes(model, lambda m: lm_loss(m(x), y))
    gc.collect()
    return out


def _module(meter: PeakMemory) -> Any:
    return torch.get_device_module(meter.device)


def _allocated(meter: PeakMemory) -> int:
    _module(meter).synchronize()
    return _module(meter).memory_allocated() - meter.start


def _now(meter: PeakMemory) -> int:
    """Bytes alive now, above the start."""
    return meter.sample() if meter.counted_here else _allocated(meter)


def _peak(meter: PeakMemory) -> int:
    """The most alive since the last restart, above the start."""
    if meter.counted_here:
        meter.sample()
        return meter.peak
    _module(meter).synchronize()
    return _module(meter).max_memory_allocated() - meter.start


class _Lifetimes(PeakMemory):
    """PeakMemory that also notes each storage's size, birth and death (operator
    indices) and the phase it was born in: `records`, one [key, born, bytes,
    phase, died] per storage (an address may serve several in turn)."""

    def __init__(self) -> None:
        super().__init__(torch.device("cpu"))
        self.ops = 0
        self.phase = "before"
        self.records: list[list] = []
        self.alive: dict[int, int] = {}  # key -> its record's index
        self.marks: dict[str, int] = {}
        self.logits = -1  # the logits' record

    def track(self, tensor: Tensor) -> None:
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return
        key = storage._cdata
        if key not in self.alive:
            self.alive[key] = len(self.records)
            self.records.append([key, self.ops, storage.nbytes(), self.phase, None])
            weakref.finalize(storage, self.die, key)
        super().track(tensor)

    def die(self, key: int) -> None:
        self.records[self.alive.pop(key)][4] = self.ops

    def sample(self) -> int:
        self.ops += 1
        return super().sample()

    def mark(self, phase: str) -> None:
        self.phase = phase
        self.marks[phase] = self.ops


def timeline(
    cfg: GPTConfig, batch: int, policy: str = "fp32", optimizer: str = "adamw"
) -> tuple[dict[str, list[int]], dict[str, int]]:
    """({kind: bytes alive after each operator of the step}, {phase: the operator
    index it begins at}) on the CPU (module docstring)."""
    device, amp = torch.device("cpu"), policy == "amp-bf16"
    x, y = batch_of(cfg, batch, device)
    model, opt = build(cfg, policy, optimizer, device)
    for _ in range(WARMUP):  # uncounted: what they leave is tracked below
        one_step(model, opt, x, y, amp)
    opt.zero_grad(set_to_none=True)
    with _Lifetimes() as life:
        for tensor in [*model.parameters(), *_state(opt), x, y]:
            life.track(tensor)
        life.mark("start")
        logits_grad = _on_logits_grad(model, life)
        one_step(model, opt, x, y, amp, life.mark)
        logits_grad.remove()
        life.mark("end")
    keys = _keys(model, opt, [x, y])
    return _alive_by_kind(life, keys), {p: life.marks[p] for p in PHASES}


def _on_logits_grad(model: nn.Module, life: _Lifetimes) -> Any:
    """Switch the phase to the backward proper once the logits' gradient exists
    (what the loss's backward makes before then is the loss region's)."""

    def hook(module: nn.Module, args: tuple, out: Tensor) -> None:
        life.logits = life.alive.get(out.untyped_storage()._cdata, -1)
        out.register_hook(lambda grad: life.mark("blocks"))

    return model.head.register_forward_hook(hook)


def _state(opt: torch.optim.Optimizer) -> list[Tensor]:
    """The optimizer's state tensors (AdamW's moments and step counters)."""
    return [t for s in opt.state.values() for t in s.values() if torch.is_tensor(t)]


def _keys(
    model: nn.Module, opt: torch.optim.Optimizer, inputs: list[Tensor]
) -> dict[str, set[int]]:
    """Storage keys of the parameters, the optimizer state, the gradients and the
    batch (kept for backward: activations)."""
    state = _state(opt)
    return {
        "activations": {t.untyped_storage()._cdata for t in inputs},
        "parameters": {p.untyped_storage()._cdata for p in model.parameters()},
        "optimizer": {t.untyped_storage()._cdata for t in state},
        "gradients": {
            p.grad.untyped_storage()._cdata
            for p in model.parameters()
            if p.grad is not None
        },
    }


def _kind(index: int, life: _Lifetimes, keys: dict) -> str:
    key, _, _, phase, died = life.records[index]
    for kind in ("activations", "parameters", "optimizer", "gradients"):
        if key in keys[kind] and died is None:
            return kind
    end = life.ops + 1 if died is None else died
    if phase in ("forward", "loss") and end > life.marks["backward"]:
        return "activations"
    if phase in ("loss", "backward") or index == life.logits:
        return "loss"
    return "temporaries"


def _alive_by_kind(life: _Lifetimes, keys: dict) -> dict[str, list[int]]:
    start, end = life.marks["start"], life.marks["end"]
    out = {kind: [0] * (end - start) for kind in TIMELINE_KINDS}
    for index, (_, born, nbytes, _, died) in enumerate(life.records):
        first, last = max(born, start), min(end if died is None else died, end)
        if last > first:
            series = out[_kind(index, life, keys)]
            for i in range(first - start, last - start):
                series[i] += nbytes
    return out


def step_seconds(
    cfg: GPTConfig,
    batch: int,
    policy: str = "fp32",
    device: torch.device | str = "cpu",
    optimizer: str = "adamw-fused",
) -> float:
    """The median seconds of a step (module docstring)."""
    device = torch.device(device)
    model, opt = build(cfg, policy, optimizer, device)
    x, y = batch_of(cfg, batch, device)
    amp = policy == "amp-bf16"
    for _ in range(WARMUP + 1):
        one_step(model, opt, x, y, amp)
    times = [
        clock.timed(lambda: one_step(model, opt, x, y, amp), device)
        for _ in range(TIMED)
    ]
    return statistics.median(times)


def hardware_here(device: torch.device) -> tuple[str, Hardware]:
    """(the device's name as its driver reports it, the planner's Hardware for it:
    the named GPU its name contains, else an H100's figures)."""
    if device.type == "cpu":
        return "CPU", GPUS["h100"]
    module = torch.get_device_module(device.type)
    name = module.get_device_name(device)
    total = module.get_device_properties(device).total_memory
    label = f"{name} ({total // 2**20} MiB)"
    found = [hw for key, hw in GPUS.items() if key in name.lower()]
    return label, (found[0] if found else GPUS["h100"])


def row(
    shape: tuple[int, ...], batch: int, policy: str, device: torch.device
) -> dict[str, Any]:
    """One measured run, as tests/data/gpu_measurements.json keeps it."""
    cfg = ModelSpec(*shape).config()
    found = measure(cfg, batch, policy, device)
    label, _ = hardware_here(device)
    return dict(
        device=label,
        torch=torch.__version__,
        date=datetime.date.today().isoformat(),
        source="python -m distcourse.plan.phases",
        mode="eager, one process",
        model=dict(
            zip(("layers", "hidden", "heads", "seq", "vocab"), shape, strict=True)
        ),
        batch=batch,
        dtype=policy,
        optimizer="adamw-fused",
        compiled=False,
        peak=found.pop("peak"),
        activations=found.pop("activations"),
        phases=found,
        step_s=round(step_seconds(cfg, batch, policy, device), 5),
    )


def planned(measured: dict[str, Any], hw: Hardware) -> dict[str, float]:
    """The planner's prediction for a row, set beside it: ratios measured/plan."""
    model = ModelSpec(**measured["model"])
    policy = DTypePolicy(measured["dtype"], "fp32", measured["optimizer"])
    p = predict(model, measured["batch"], policy, PlanLayout(), hw)
    out = {"step_s": measured["step_s"] / p.time["total"]}
    for key, mine in (("peak", "total"), ("activations", "activations")):
        if measured.get(key):
            out[key] = measured[key] / p.memory[mine]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m distcourse.plan.phases")
    parser.add_argument("--append", type=Path, help="a JSON file of rows to extend")
    parser.add_argument(
        "--quick", action="store_true", help="a small shape, any device"
    )
    parser.add_argument(
        "--device", help="the device to measure (default: the accelerator, else cpu)"
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    here = torch.accelerator.is_available()
    device = torch.accelerator.current_accelerator() if here else torch.device("cpu")
    device = torch.device(args.device) if args.device else device
    if device.type == "cpu" and not args.quick:
        print("no GPU here: give --quick for a small shape on the CPU")
        return 2
    label, hw = hardware_here(device)
    rows = [row(*r, device) for r in (QUICK if args.quick else ROWS)]
    for r in rows:
        ratios = ", ".join(f"{k} {v:.3f}" for k, v in planned(r, hw).items())
        print(f"{label}: {r['model']} batch {r['batch']} {r['dtype']}: {ratios}")
    if args.append:
        data = json.loads(args.append.read_text())
        data["rows"] += rows
        args.append.write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
