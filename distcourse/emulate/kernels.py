"""What the emulated GPU registers with torch's dispatcher: a fused attention, as a
GPU has one, and autocast's pass-through.

torch picks `scaled_dot_product_attention`'s kernel by device type, and a device
registered from Python (PrivateUse1) has no fused kernel: torch runs its math path,
which keeps the s x s scores for backward. A GPU runs a fused kernel that keeps its
output and a log-sum-exp per head and token instead, and chapter 4's activation
memory counts exactly that. So the emulated device registers, under torch's
AutogradPrivateUse1 key, an attention that runs the CPU's fused (flash) kernel on the
host data, with torch's autograd formula for it: it saves query, key, value, output
and log-sum-exp. CUDA's
own kernel pads the log-sum-exp to 32 tokens and keeps a random-number seed: only a
real box shows that (`parallel.tensor.memory.fused_attention_lse_bytes`).

Cases the CPU kernel does not take (dropout, grouped-query heads, a query without
4 dimensions), and `sdpa_kernel(SDPBackend.MATH)`, run torch's math path.

`torch.autocast("gpu", ...)` turns on the dispatch key AutocastPrivateUse1, where torch
registers no kernel for most ops ("Could not run 'aten::embedding' with arguments from
the 'Autocastgpu' backend"). The emulated device's fallback there applies the CPU's
autocast policy (ATen's autocast_mode.cpp, its KERNEL_CPU lists), as the CPU kernels
run: matmuls, convolutions and attention in the autocast dtype, the losses in float32,
every other op in its own dtype. A GPU's policy casts more to float32 (softmax, norms,
sums: CUDA's list), which only a real box shows.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch.utils._pytree import tree_map

from distcourse.emulate.ordinal import DEVICE_TYPE

_aten = torch.ops.aten
_library: list[torch.library.Library] = []  # kept alive: the registration lives in it


def register() -> None:
    """Register the fused attention and autocast's policy (idempotent): a kernel
    under AutocastPrivateUse1 for every overload of the listed ops, a fallthrough
    for the rest."""
    if _library:
        return
    aten = torch.library.Library("aten", "IMPL")
    aten.impl("scaled_dot_product_attention", _attention, "AutogradPrivateUse1")
    every_op = torch.library.Library("_", "IMPL")
    every_op.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
    for names, dtype in ((_LOWER, None), (_FP32, torch.float32)):
        for name in sorted(names):
            packet = getattr(_aten, name)
            for overload in packet.overloads():
                op = getattr(packet, overload)
                aten.impl(op, functools.partial(_autocast, op, dtype), _AUTOCAST)
    _library.extend((aten, every_op))


_LOWER = {  # the CPU's lower-precision list: run in the autocast dtype
    *("conv1d", "conv2d", "conv3d", "conv_tbc", "prelu", "_convolution"),
    *("conv_transpose1d", "conv_transpose2d", "conv_transpose3d"),
    *("mm", "bmm", "addmm", "addbmm", "baddbmm", "matmul", "linear"),
    *("linalg_vecdot", "scaled_dot_product_attention"),
}
_FP32 = {  # the CPU's float32 list, its losses
    *("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "kl_div"),
    *("nll_loss", "nll_loss2d", "cross_entropy_loss", "binary_cross_entropy"),
    *("binary_cross_entropy_with_logits", "poisson_nll_loss", "soft_margin_loss"),
    *("hinge_embedding_loss", "cosine_embedding_loss", "margin_ranking_loss"),
    *("triplet_margin_loss", "multi_margin_loss", "multilabel_margin_loss"),
}
_AUTOCAST = "AutocastPrivateUse1"
_NO_AUTOCAST = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)


def _autocast(op: Any, dtype: torch.dtype | None, *args: Any, **kwargs: Any) -> Any:
    """Cast `op`'s floating device tensors to `dtype` (None: the autocast dtype),
    then run it below autocast (as ATen's autocast kernels do: autograd records the
    casts)."""
    dtype = dtype or torch.get_autocast_dtype(DEVICE_TYPE)
    with torch._C._ExcludeDispatchKeyGuard(_NO_AUTOCAST):
        args, kwargs = tree_map(lambda x: _cast(x, dtype), (args, kwargs))
        return op(*args, **kwargs)


def _cast(x: Any, dtype: torch.dtype) -> Any:
    """x in `dtype` if it is a floating tensor on the device (not float64)."""
    eligible = (
        isinstance(x, torch.Tensor)
        and x.device.type == DEVICE_TYPE
        and x.is_floating_point()
        and x.dtype not in (dtype, torch.float64)
    )
    return x.to(dtype) if eligible else x


def _attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    fused = dropout_p == 0.0 and not enable_gqa and query.dim() == 4
    chosen = torch.backends.cuda.flash_sdp_enabled() or (
        torch.backends.cuda.mem_efficient_sdp_enabled()
    )  # `sdpa_kernel(SDPBackend.MATH)` turns both off: the scores are kept then
    if not (fused and chosen):  # torch's math path (what ran before this module)
        out, _ = _aten._scaled_dot_product_attention_math(
            query,
            key,
            value,
            attn_mask,
            dropout_p,
            is_causal,
            None,
            scale=scale,
            enable_gqa=enable_gqa,
        )
        return out
    # the CPU kernel's op, called on the device tensors: its autograd formula is
    # torch's (saving query, key, value, output and log-sum-exp), and each of its
    # kernels reaches the device tensors' host data through their dispatch
    out, _ = _aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, 0.0, is_causal, attn_mask=attn_mask, scale=scale
    )
    return out
