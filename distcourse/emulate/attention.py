"""A fused attention kernel for the emulated GPU, as a GPU has one.

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
4 dimensions) run torch's math path, as before.
"""

from __future__ import annotations

import torch

_aten = torch.ops.aten
_library: list[torch.library.Library] = []  # kept alive: the registration lives in it


def register() -> None:
    """Register the fused attention for the emulated device (idempotent)."""
    if _library:
        return
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("scaled_dot_product_attention", _attention, "AutogradPrivateUse1")
    _library.append(lib)


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
    if not fused:  # torch's math path (what ran before this module)
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
