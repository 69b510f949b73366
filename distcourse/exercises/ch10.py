"""Chapter 10's exercises: memory and time, and a plan that fits.

1. `check_mixed_precision_bytes(x)`: bytes of model state per parameter when
   training with mixed precision and Adam (16-bit weights and gradients, fp32 master
   weights and moments), before any sharding.
2. `check_activation_memory(x)`: bytes of activations a 24-layer transformer keeps
   for backward at 16 bits (Korthikanti et al., dropout included) with s = 2048,
   b = 4, h = 2048, a = 16 heads, no parallelism and no recomputation.
3. `check_recompute_memory(x)`: the same model with full activation recomputation,
   which keeps only each layer's 16-bit input.
4. `check_zero_stage_that_fits(x)`: a 13-billion-parameter model, mixed precision and
   Adam, on 8 GPUs of 40 GiB each: the smallest ZeRO stage (0 = plain data
   parallelism, 1, 2 or 3) whose model state fits (activations aside).
5. `check_step_time(x)`: seconds per step of a 10^9-parameter model trained on 2^20
   tokens per step, by 8 GPUs of 312 TFLOP/s each at 40 % model FLOPs utilisation
   (6 FLOPs per parameter per token).
"""

from __future__ import annotations

from distcourse.exercises.core import check_number
from distcourse.parallel.tensor.memory import korthikanti_bytes

EXERCISES = (
    "mixed_precision_bytes",
    "activation_memory",
    "recompute_memory",
    "zero_stage_that_fits",
    "step_time",
)
LAYERS, SEQ, BATCH, WIDTH, HEADS = 24, 2048, 4, 2048, 16
HALF, MASTER = 2, 12  # bytes per parameter: 16-bit copy; fp32 weight + 2 moments


def zero_bytes(stage: int, psi: float, n: int) -> float:
    """Mixed-precision Adam model state per rank at ZeRO `stage` (2 + 2 + 12)."""
    weights = HALF * psi / (n if stage == 3 else 1)
    grads = HALF * psi / (n if stage >= 2 else 1)
    state = MASTER * psi / (n if stage >= 1 else 1)
    return weights + grads + state


def check_mixed_precision_bytes(answer: object) -> bool:
    """Bytes per parameter, mixed precision with Adam: a number."""
    return check_number(
        "ch10.mixed_precision_bytes",
        answer,
        2 * HALF + MASTER,
        hint="2 bytes of 16-bit weight, 2 of 16-bit gradient, and 12 of fp32 state: "
        "the master weight and Adam's two moments, 4 bytes each",
    )


def check_activation_memory(answer: object) -> bool:
    """Activation bytes of the 24-layer model, s=2048 b=4 h=2048 a=16: a number."""
    layer = korthikanti_bytes(batch=BATCH, seq=SEQ, width=WIDTH, heads=HEADS)
    return check_number(
        "ch10.activation_memory",
        answer,
        LAYERS * layer,
        hint="per layer sbh(34 + 5as/h) bytes (chapter 4), times the 24 layers",
    )


def check_recompute_memory(answer: object) -> bool:
    """The same model's activation bytes with full recomputation: a number."""
    return check_number(
        "ch10.recompute_memory",
        answer,
        LAYERS * 2 * SEQ * BATCH * WIDTH,
        hint="a recomputed layer keeps only its input, s x b x h values of 2 bytes; "
        "backward rebuilds the rest, one layer at a time",
    )


def check_zero_stage_that_fits(answer: object) -> bool:
    """The smallest ZeRO stage for 13e9 parameters on 8 x 40 GiB: 0, 1, 2 or 3."""
    fits = [s for s in range(4) if zero_bytes(s, 13e9, 8) <= 40 * 2**30]
    return check_number(
        "ch10.zero_stage_that_fits",
        answer,
        fits[0],
        hint="per rank: stage 0 16Ψ, stage 1 4Ψ + 12Ψ/N, stage 2 2Ψ + 14Ψ/N, "
        "stage 3 16Ψ/N; compare each with 40 GiB",
    )


def check_step_time(answer: object) -> bool:
    """Seconds per step, 10^9 parameters, 2^20 tokens, 8 x 312 TFLOP/s at 40 %."""
    flops = 6 * 1e9 * 2**20
    return check_number(
        "ch10.step_time",
        answer,
        flops / (8 * 312e12 * 0.4),
        rel=1e-2,
        hint="a step costs 6 Ψ D FLOPs (2 forward, 4 backward per parameter and "
        "token); the machine delivers GPUs x peak x utilisation FLOP/s",
    )
