"""What the GPU suite's files share: its device, its world sizes, how ranks start.

The suite runs each strategy's module on the device at the world sizes the box
allows and compares it with one process on the same device. The root conftest.py
puts every pytest run on CPU ranks (DISTCOURSE_DEVICE=cpu, for the stored notebook
outputs); this suite chooses its device itself, through its own variable:

    DISTCOURSE_GPU_SUITE_DEVICE=cuda  NCCL ranks, one GPU each (an error without CUDA)
    DISTCOURSE_GPU_SUITE_DEVICE=emulated  emulated GPUs (distcourse.emulate): one per
                                      rank under NCCL's rules, on a CPU machine
    DISTCOURSE_GPU_SUITE_DEVICE=cpu   gloo ranks on the CPU: the dry run
    unset                             cuda where torch sees a GPU, else skipped

NCCL needs a GPU per rank (it refuses two ranks on one GPU), so on cuda the world
sizes are those of WORLD_SIZES that fit the visible GPUs: 1 on a one-GPU box, all of
them (up to 4) on a larger box. An emulated box has as many GPUs as asked, so it
runs every size; the CPU dry run 1 and 2. The arguments passed to `spawn` name the
backend and device, so the ranks do not read DISTCOURSE_DEVICE.

Tolerances are float32's: a parallel run reorders sums (a matmul split in pieces, a
GPU kernel picked by shape), which moves results by a few ulps, about 1e-7 of values
of order 1; TOL = 1e-5 is far above that and far below any bug, which moves results
by the order of the values themselves. TF32 is switched off on every rank: it would
round matmul inputs to 10 bits and make 1e-3 differences legitimate.

With DISTCOURSE_TRACE_DIR set, each rank records what it dispatched and sent
(`distcourse.emulate.recorder`) into that folder, one file per test program, world
size and rank: tools/gpu_check.sh keeps the GPU's in tests/data/gpu_traces/.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from distcourse import runtime
from distcourse.emulate import recorder
from distcourse.launch import spawn

VARIABLE = "DISTCOURSE_GPU_SUITE_DEVICE"
TRACE_VARIABLE = "DISTCOURSE_TRACE_DIR"  # set: each rank writes its trace there
EMULATED = "emulated"  # runtime.EMULATED: the value DISTCOURSE_DEVICE takes too
DEVICES = ("cpu", "cuda", EMULATED)
WORLD_SIZES = (1, 2, 4, 8)  # 8: a full 8-GPU box
# what `spawn` is told: NCCL on cuda, the emulated backend and device, gloo on the CPU
BACKENDS = {"cuda": "nccl", EMULATED: EMULATED, "cpu": "gloo"}
TOL = 1e-5


def device_type() -> str | None:
    """'cuda', 'emulated' or 'cpu' as the variable asks; unset: 'cuda' if torch sees
    a GPU, else None (the suite is skipped). ValueError on any other value."""
    value = os.environ.get(VARIABLE, "").strip().lower()
    if value not in ("", *DEVICES):
        raise ValueError(
            f"{VARIABLE}={os.environ[VARIABLE]!r}: use 'cuda', {EMULATED!r} or 'cpu'"
        )
    if value:
        return value
    return "cuda" if torch.cuda.is_available() else None


def skip_reason() -> str | None:
    """Why the suite does not run here, or None when it does."""
    if device_type() is None:
        return f"no CUDA device (run it on the CPU with {VARIABLE}=cpu)"
    return None


def world_sizes() -> list[int]:
    """The world sizes this box allows: one GPU per NCCL rank (every size on an
    emulated box, which has as many GPUs as asked); 1 and 2 on the CPU.

    RuntimeError where cuda is asked for and torch sees no GPU: a GPU check that
    skipped itself there would pass on a box whose CUDA is broken.
    """
    kind = device_type()
    if kind is None:
        return []
    if kind == "cpu":
        return [1, 2]
    if kind == EMULATED:
        return list(WORLD_SIZES)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if not gpus:
        raise RuntimeError(f"{VARIABLE}=cuda, but torch sees no CUDA device")
    return [w for w in WORLD_SIZES if w <= gpus]


def run(fn: Callable[..., Any], world: int, *args: Any) -> list[Any]:
    """`fn(*args)` on `world` ranks of the suite's device; results by rank."""
    backend = BACKENDS[device_type() or "cpu"]
    return spawn(_on_rank, world, fn, *args, backend=backend, timeout=60)


def _on_rank(fn: Callable[..., Any], *args: Any) -> Any:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    folder = os.environ.get(TRACE_VARIABLE)
    if not folder:
        return fn(*args)
    with recorder.Recorder() as seen:  # tools/gpu_check.sh's traces step
        result = fn(*args)
    rank, world = dist.get_rank(), dist.get_world_size()
    name = f"{fn.__module__}.{fn.__name__}-world{world}-rank{rank}.json"
    trace = {
        **recorder.header(runtime.device(), f"gpu-suite {fn.__module__}.{fn.__name__}"),
        "ops": seen.ops,
        "messages": seen.messages,
    }
    Path(folder).mkdir(parents=True, exist_ok=True)
    (Path(folder) / name).write_text(json.dumps(trace) + "\n")
    return result


def diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest |a - b| / max(1, max |b|): one process `b` sets the scale."""
    assert a.shape == b.shape and a.device == b.device, (a.shape, b.shape)
    scale = max(1.0, b.detach().abs().max().item()) if b.numel() else 1.0
    return (a.detach() - b.detach()).abs().max().item() / scale if a.numel() else 0.0
