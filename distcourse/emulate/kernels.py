"""What the emulated GPU registers with torch's dispatcher: CUDA's attention and
CUDA's autocast policy.

- Attention (`emulate/attention.py`): `scaled_dot_product_attention` runs the kernel
  CUDA would choose (`distcourse.sdpa`), each keeping what that kernel keeps.
- Autocast (`emulate/autocast.py`): `torch.autocast("gpu", ...)` turns on the
  dispatch key AutocastPrivateUse1, where torch registers no kernel for most ops;
  the emulated device registers CUDA's policy there, read from the installed
  torch's ATen/autocast_mode.h, and a fallthrough for every other op (run in its
  inputs' dtypes, as on CUDA).
- What a CUDA kernel keeps where the CPU's keeps otherwise (HOST, used by the
  device's dispatch in place of the host's kernel): layer norm of a float16 or
  bfloat16 input keeps its mean and 1/std in float32 on CUDA (its kernels
  accumulate in float32; torch/_refs/__init__.py `native_layer_norm` casts them
  to the input's dtype only on the CPU and MTIA), so here it computes in float32
  and returns the output in the input's dtype, the statistics in float32.
"""

from __future__ import annotations

import torch

from distcourse.emulate import attention, autocast

_aten = torch.ops.aten
_HALF = (torch.float16, torch.bfloat16)
_library: list[torch.library.Library] = []  # kept alive: the registration lives in it
MISSING: list[str] = []  # header entries that name no op of this torch


def register() -> None:
    """Register attention and autocast's policy (idempotent)."""
    if _library:
        return
    aten = torch.library.Library("aten", "IMPL")  # noqa: TOR901 (kept alive below)
    attention.register(aten)
    every_op = torch.library.Library("_", "IMPL")  # noqa: TOR901
    every_op.fallback(torch.library.fallthrough_kernel, autocast.KEY)
    MISSING.extend(autocast.register(aten))
    _library.extend((aten, every_op))


def _up(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.float()


def _layer_norm(x, shape, weight=None, bias=None, eps=1e-5):  # type: ignore[no-untyped-def]
    """CUDA's native_layer_norm: a 16-bit input's statistics in float32."""
    if x.dtype not in _HALF:
        return _aten.native_layer_norm.default(x, shape, weight, bias, eps)
    y, mean, rstd = _aten.native_layer_norm.default(
        x.float(), shape, _up(weight), _up(bias), eps
    )
    return y.to(x.dtype), mean, rstd


def _layer_norm_backward(grad, x, shape, mean, rstd, weight, bias, mask):  # type: ignore[no-untyped-def]
    """The backward of `_layer_norm`, gradients in their tensors' dtypes."""
    if x.dtype not in _HALF:
        return _aten.native_layer_norm_backward.default(
            grad, x, shape, mean, rstd, weight, bias, mask
        )
    grads = _aten.native_layer_norm_backward.default(
        grad.float(), x.float(), shape, mean, rstd, _up(weight), _up(bias), mask
    )
    like = (x, weight, bias)
    return tuple(
        None if g is None else g.to(t.dtype) for g, t in zip(grads, like, strict=True)
    )


HOST = {  # op -> the host kernel that computes it as CUDA's does
    _aten.native_layer_norm.default: _layer_norm,
    _aten.native_layer_norm_backward.default: _layer_norm_backward,
}
