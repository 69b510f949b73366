"""Which kernel torch's `scaled_dot_product_attention` runs, and what it keeps.

torch picks one of several kernels for SDPA at run time, by device, dtype, head
size, mask, dropout and grouped-query heads, and each keeps different tensors for
backward: the fused kernels a log-sum-exp per head and token (and, on CUDA, their
random-number state), the math path the whole s x s score matrix. A memory
formula, the planner and the emulated GPU must all make the choice torch makes, so
it is written once, here. This module imports only torch.

Sources (read, not copied), for 4-dimensional dense inputs:

- CUDA: aten/src/ATen/native/transformers/cuda/sdp_utils.cpp (pytorch/pytorch,
  commit 001f694): `select_sdp_backend` walks a priority order and takes the first
  kernel whose checks pass. The order is the context's default (flash, efficient,
  math, cuDNN: ATen/Context.h, torch 2.14.1), or cuDNN first where
  `check_prefer_cudnn_attention` holds: compute capability 9.x or 10.x with a cuDNN
  newer than 9.15.0 (CUDA 13 wheels; the variable TORCH_CUDNN_SDPA_DEPRIORITIZED=1
  turns it off). Measured on one H200 (torch 2.11.0+cu130, 2026-12-04): TinyGPT's
  attention under bf16 autocast, head size 8, ran `_scaled_dot_product_cudnn_
  attention`; a block with head size 2 in fp32 ran the math path.
  * cuDNN (`can_use_cudnn_attention`): fp16/bf16 (fp16 only below sm80), sm80 to
    sm121, a dropout that is a multiple of 1/16, a mask allowed, grouped-query
    heads allowed, head size a multiple of 8 and at most 128
    (`check_cudnn_tensor_shapes`; larger heads need a newer cuDNN than the one
    modelled), a key sequence longer than 1, not under deterministic algorithms.
  * Flash (`can_use_flash_attention`): fp16/bf16, sm80 to sm121, no mask, head
    size at most 256, causal only with equal query and key lengths; on sm86-89 and
    sm120-121 a head size in (192, 224] (or above 224 with dropout) cannot train.
  * Memory-efficient (`can_use_mem_efficient_attention`): fp16, fp32 and, from
    sm80, bf16; sm50 to sm121; masks and dropout allowed; the head size divisible
    by `minimum_gemm_alignment` (on sm80 and later 8 for 16-bit types, 4 for fp32).
  * Math: whenever it is enabled.
- CPU: aten/src/ATen/native/transformers/sdp_utils_cpp.cpp and the installed
  torch's ATen/native/transformers/sdp_utils_cpp.h: flash first (fp32, fp64,
  bf16, fp16; no dropout; masks and grouped-query heads allowed), else math.
  `torch.ops.aten._fused_sdp_choice` answers the CPU's choice live, and the tests
  hold this module to it.
- What each kernel keeps: torch/_meta_registrations.py (torch 2.14.1), the shape
  functions of `_scaled_dot_product_cudnn_attention`, `_flash_attention`,
  `_efficient_attention` and `_flash_attention_for_cpu`, with the inputs torch's
  autograd formulas pass to their backward; the math path is measured (its
  composite, aten's `_scaled_dot_product_attention_math`, is the same code on
  every device).

Layout, stride and pointer-alignment checks are taken as passed (contiguous last
dimension, aligned storage), and nested tensors are not modelled.
"""

from __future__ import annotations

import math
import os

import torch

CUDA_KERNELS = ("cudnn", "flash", "efficient", "math")
CPU_KERNELS = ("cpu_flash", "math")
KERNELS = (*CUDA_KERNELS, "cpu_flash")

# the aten op each kernel runs (what a dispatch trace shows)
OPS = {
    "cudnn": "_scaled_dot_product_cudnn_attention",
    "flash": "_scaled_dot_product_flash_attention",
    "efficient": "_scaled_dot_product_efficient_attention",
    "cpu_flash": "_scaled_dot_product_flash_attention_for_cpu",
    "math": "_scaled_dot_product_attention_math",
}

_HALF = (torch.float16, torch.bfloat16)
_DEFAULT_ORDER = ("flash", "efficient", "math", "cudnn")  # ATen/Context.h
_CUDNN_ORDER = ("cudnn", "flash", "efficient", "math")  # check_prefer_cudnn_attention
_CUDNN_HEAD_LIMIT = 128
_FLASH_HEAD_LIMIT = 256


def enabled_kernels() -> frozenset[str]:
    """The kernels torch's global switches allow now (`torch.backends.cuda.*_sdp_
    enabled`, which `torch.nn.attention.sdpa_kernel` sets; the CPU's flash kernel
    follows the flash switch, as `check_runtime_disabled_flash` reads the same
    flag)."""
    flags = {
        "flash": torch.backends.cuda.flash_sdp_enabled(),
        "cpu_flash": torch.backends.cuda.flash_sdp_enabled(),
        "efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
        "cudnn": torch.backends.cuda.cudnn_sdp_enabled(),
        "math": torch.backends.cuda.math_sdp_enabled(),
    }
    return frozenset(name for name, on in flags.items() if on)


def choose_kernel(
    device_type: str,
    dtype: torch.dtype,
    head_dim: int,
    *,
    mask: bool = False,
    dropout: float = 0.0,
    gqa: bool = False,
    causal: bool = False,
    capability: tuple[int, int] = (9, 0),
    seq_q: int | None = None,
    seq_k: int | None = None,
    requires_grad: bool = True,
    enabled: frozenset[str] | None = None,
) -> str:
    """The kernel torch runs for 4-D dense inputs: "cudnn", "flash", "efficient" or
    "math" on "cuda"; "cpu_flash" or "math" on "cpu".

    `capability`: the GPU's compute capability (default an H100/H200's 9.0).
    `seq_q`, `seq_k`: the sequence lengths, where a rule reads them (a causal
    flash needs them equal; cuDNN refuses one key); unknown lengths pass.
    `gqa`: grouped-query heads (`enable_gqa=True`, heads dividing evenly): every
    kernel takes them. `enabled`: the kernels allowed (default: torch's switches
    now, `enabled_kernels()`). Raises RuntimeError when no kernel is allowed, as
    torch does ("No available kernel").
    """
    allowed = enabled_kernels() if enabled is None else frozenset(enabled)
    if device_type not in _CHOOSERS:
        raise ValueError(f"choose_kernel: no rules for device type {device_type!r}")
    if head_dim < 1:
        raise ValueError(f"choose_kernel: head_dim must be positive, got {head_dim}")
    case = {
        "dtype": dtype,
        "head_dim": head_dim,
        "mask": mask,
        "dropout": dropout,
        "gqa": gqa,
        "causal": causal,
        "capability": capability,
        "seq_q": seq_q,
        "seq_k": seq_k,
        "requires_grad": requires_grad,
    }
    for kernel in _CHOOSERS[device_type](capability):
        if kernel in allowed and _CHECKS[kernel](case):
            return kernel
    raise RuntimeError(
        f"No available kernel for scaled_dot_product_attention on {device_type} "
        f"({dtype}, head size {head_dim}); enabled: {sorted(allowed)}"
    )


def _cuda_order(capability: tuple[int, int]) -> tuple[str, ...]:
    deprioritized = os.environ.get("TORCH_CUDNN_SDPA_DEPRIORITIZED", "") in ("1", "ON")
    if capability[0] in (9, 10) and not deprioritized:
        return _CUDNN_ORDER
    return _DEFAULT_ORDER


def _cpu_order(capability: tuple[int, int]) -> tuple[str, ...]:
    return CPU_KERNELS


_CHOOSERS = {"cuda": _cuda_order, "cpu": _cpu_order}


def _between(capability: tuple[int, int], low: tuple[int, int]) -> bool:
    """sm `low` <= capability <= sm121 (`check_sm_version`)."""
    return low <= tuple(capability) <= (12, 1)


def _low_precision(case: dict) -> bool:
    """`check_dtypes_low_precision`: fp16 and bf16 from sm80, fp16 below."""
    allowed = _HALF if case["capability"][0] >= 8 else (torch.float16,)
    return case["dtype"] in allowed


def _keys_ok(case: dict) -> bool:
    return case["seq_k"] is None or case["seq_k"] > 0


def _cudnn(case: dict) -> bool:
    deterministic = (
        torch.are_deterministic_algorithms_enabled()
        and not torch.is_deterministic_algorithms_warn_only_enabled()
    )
    d = case["head_dim"]
    return (
        not deterministic
        and _low_precision(case)
        and _between(case["capability"], (8, 0))
        and case["dropout"] * 16.0 == math.floor(case["dropout"] * 16.0)
        and d % 8 == 0
        and d <= _CUDNN_HEAD_LIMIT
        and case["seq_k"] != 1
        and _keys_ok(case)
    )


def _flash(case: dict) -> bool:
    d, (major, minor) = case["head_dim"], case["capability"]
    training_limited = (8, 6) <= (major, minor) <= (8, 9) or (12, 0) <= (
        major,
        minor,
    ) <= (12, 1)
    if training_limited and case["requires_grad"]:
        if not (d <= 192 or (case["dropout"] == 0.0 and d > 224)):
            return False
    unequal = (
        case["seq_q"] is not None
        and case["seq_k"] is not None
        and case["seq_q"] != case["seq_k"]
    )
    return (
        not case["mask"]
        and d <= _FLASH_HEAD_LIMIT
        and _between(case["capability"], (8, 0))
        and not (case["causal"] and unequal)
        and _low_precision(case)
        and _keys_ok(case)
    )


def gemm_alignment(dtype: torch.dtype, capability: tuple[int, int]) -> int:
    """`minimum_gemm_alignment`: what the memory-efficient kernel's head size must
    divide by (tensor cores from sm80, or sm70 for 16-bit types)."""
    half = dtype in _HALF
    major = capability[0]
    tensor_cores = major >= 8 or (major >= 7 and half)
    alignment = 4 if major >= 8 else 1
    if tensor_cores:
        alignment = max(alignment, 128 // (16 if half else 32))
    return alignment


def _efficient(case: dict) -> bool:
    major = case["capability"][0]
    dtypes = (torch.float16, torch.float32) + ((torch.bfloat16,) if major >= 8 else ())
    return (
        _between(case["capability"], (5, 0))
        and case["head_dim"] % gemm_alignment(case["dtype"], case["capability"]) == 0
        and case["dtype"] in dtypes
        and _keys_ok(case)
    )


def _cpu_flash(case: dict) -> bool:
    dtypes = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
    return case["dropout"] == 0.0 and case["dtype"] in dtypes and _keys_ok(case)


def _math(case: dict) -> bool:
    return True


_CHECKS = {
    "cudnn": _cudnn,
    "flash": _flash,
    "efficient": _efficient,
    "cpu_flash": _cpu_flash,
    "math": _math,
}


def _size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def saved_bytes(
    kernel: str,
    batch: int,
    heads: int,
    seq: int,
    head_dim: int,
    dtype: torch.dtype,
) -> dict[str, int]:
    """Bytes `kernel` keeps for backward beyond q, k, v and its output, by name,
    in the dtypes that kernel uses (self-attention: `seq` queries and keys).

    - "cudnn": "lse" float32 (B, H, S, 1), "seed" and "offset" one int64 each;
    - "flash" (CUDA): "lse" float32 (B, H, S), "seed" two uint64 and "offset"
      one uint64 (the Philox state, kept even without dropout); for a head size
      that is not a multiple of 8, "padding": aten's composite pads q, k and v to
      the next multiple of 8 (`pad_last_dim<8>`), the kernel keeps them and its
      output padded, and the output sliced back is a view of the padded one, so
      whatever keeps it whole (the projection after) keeps its own copy: what the
      padding adds to q, k, v and an output, plus that copy;
    - "efficient": "lse" float32 padded to a multiple of 32 tokens (B, H,
      ceil(S / 32) * 32), "seed" and "offset" one int64 each;
    - "cpu_flash": "lse" (B, H, S) in the computation dtype (float32 for 16-bit
      inputs, else the input's);
    - "math": "scores", the softmax output (B, H, S, S) in float32 for 16-bit
      inputs (the math path computes in float32 unless
      `allow_fp16_bf16_reduction_math_sdp`), else in the input's dtype; for
      16-bit inputs "upcast", what its float32 copies of q, k and v add to them.
      The math path keeps q and k as scaled copies of the same size and v as it
      is, and keeps no output (a following projection keeps its own copy), so
      q, k, v and an output plus these entries is what a block keeps.

    Dropout does not change what the fused kernels keep (they replay it from the
    seed); the math path's dropout mask and grouped-query copies are not counted.
    """
    if kernel not in KERNELS:
        raise ValueError(f"saved_bytes: unknown kernel {kernel!r}; one of {KERNELS}")
    tokens = batch * heads * seq
    f32, i64 = 4, 8
    if kernel == "cudnn":
        return {"lse": tokens * f32, "seed": i64, "offset": i64}
    if kernel == "flash":
        kept = {"lse": tokens * f32, "seed": 2 * i64, "offset": i64}
        pad = -head_dim % 8
        if pad:
            padded = 4 * tokens * pad * _size(dtype)  # q, k, v and out, wider
            kept["padding"] = padded + tokens * head_dim * _size(dtype)  # a copy
        return kept
    if kernel == "efficient":
        padded = batch * heads * math.ceil(seq / 32) * 32
        return {"lse": padded * f32, "seed": i64, "offset": i64}
    half = dtype in _HALF
    if kernel == "cpu_flash":
        return {"lse": tokens * (f32 if half else _size(dtype))}
    if not half or torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed():
        return {"scores": tokens * seq * _size(dtype)}
    return {
        "scores": tokens * seq * f32,
        "upcast": 3 * tokens * head_dim * (f32 - _size(dtype)),
    }
