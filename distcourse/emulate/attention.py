"""Scaled-dot-product attention on the emulated GPU: the kernel CUDA would run.

torch picks SDPA's kernel by device type, and a device registered from Python has
none of CUDA's: torch would run its math path everywhere. So the emulated device
registers, under AutogradPrivateUse1, `scaled_dot_product_attention` as aten's
composite runs it on CUDA (aten/src/ATen/native/transformers/attention.cpp,
`scaled_dot_product_attention`): the kernel is `distcourse.sdpa.choose_kernel("cuda",
...)` for an H100/H200 (sm90), with torch's switches (`sdpa_kernel`) obeyed; a
boolean mask becomes an additive one; the flash kernel gets q, k and v padded to a
head size that is a multiple of 8 and its output sliced back; the memory-efficient
kernel gets its mask expanded to (B, H, Sq, Sk). Then the CUDA kernel's own aten op
runs (`_scaled_dot_product_cudnn_attention`, `_flash_attention` or
`_efficient_attention`) under torch's autograd formula for it, so what it keeps for
backward is what CUDA keeps: the output, a float32 log-sum-exp in that kernel's
shape and its random-number state (`distcourse.sdpa.saved_bytes`). Where it picks
the math path (fp32 with a head size of 2, say), torch's math composite runs and
keeps the s x s scores, as on the GPU.

Those three ops have no CPU kernel; `register` gives them one (and their backward),
which computes on the host in float32: scores, a log-sum-exp, softmax, dropout with
a mask drawn from the seed the op returns (so backward replays it), and the
gradients by the softmax's formula. Grouped-query K/V heads are repeated for the
computation and their gradients summed back. Numerics are the host's: what the
GPU's kernels round differently is not seen here. Not modelled: the memory-efficient
kernel's mask padding, nested tensors.
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F

from distcourse import sdpa

_aten = torch.ops.aten
CAPABILITY = (9, 0)  # the GPU the emulated box stands for: an H100/H200


def kernel_for(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    dropout_p: float,
    is_causal: bool,
    enable_gqa: bool,
) -> str:
    """The kernel CUDA runs for these inputs (`sdpa.choose_kernel`); the math path
    for inputs that are not 4-dimensional (`check_tensor_shapes`)."""
    if not query.dim() == key.dim() == value.dim() == 4:
        return "math"
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    return sdpa.choose_kernel(
        "cuda",
        query.dtype,
        query.size(-1),
        mask=attn_mask is not None,
        dropout=dropout_p,
        gqa=enable_gqa and key.size(1) != query.size(1),
        causal=is_causal,
        capability=CAPABILITY,
        seq_q=query.size(-2),
        seq_k=key.size(-2),
        requires_grad=grad,
    )


def _additive(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """`convert_boolean_attn_mask`: True keeps a position, False adds -inf."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    zeros = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return zeros.masked_fill(mask.logical_not(), -math.inf)


def attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """`scaled_dot_product_attention` as aten's composite runs it on CUDA."""
    kernel = kernel_for(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
    mask = _additive(attn_mask, query.dtype)
    lse = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    if kernel == "cudnn":
        return _aten._scaled_dot_product_cudnn_attention(
            query, key, value, mask, lse, dropout_p, is_causal, False, scale=scale
        )[0]
    if kernel == "efficient":
        if mask is not None:
            shape = (query.size(0), query.size(1), query.size(2), key.size(2))
            mask = mask.expand(shape)
        return _aten._scaled_dot_product_efficient_attention(
            query, key, value, mask, lse, dropout_p, is_causal, scale=scale
        )[0]
    if kernel == "flash":
        head = query.size(-1)
        pad = (-head) % 8
        padded = [F.pad(t, (0, pad)) if pad else t for t in (query, key, value)]
        scale = 1.0 / math.sqrt(head) if scale is None else scale
        out = _aten._scaled_dot_product_flash_attention(
            *padded, dropout_p, is_causal, False, scale=scale
        )[0]
        return out[..., :head] if pad else out
    return _aten._scaled_dot_product_attention_math(
        query,
        key,
        value,
        mask,
        dropout_p,
        is_causal,
        None,
        scale=scale,
        enable_gqa=enable_gqa,
    )[0]


# ------------------------------------------------- host kernels of CUDA's ops ----


def _grouped(query: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    """K or V with its heads repeated to the query's (grouped-query attention)."""
    rep = query.size(1) // kv.size(1)
    return kv.repeat_interleave(rep, dim=1) if rep > 1 else kv


def _folded(grad: torch.Tensor, heads: int) -> torch.Tensor:
    """The gradient of repeated K/V heads summed back to `heads` heads."""
    b, h, s, d = grad.shape
    return grad.view(b, heads, h // heads, s, d).sum(2) if h != heads else grad


def _probabilities(
    q: torch.Tensor,
    k: torch.Tensor,
    bias: torch.Tensor | None,
    causal: bool,
    scale: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(softmax, log-sum-exp) in float32 over the keys."""
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    scores = torch.matmul(q.float(), _grouped(q, k).float().transpose(-2, -1)) * scale
    if bias is not None:
        scores = scores + bias.float()
    if causal:
        keep = torch.ones(q.size(-2), k.size(-2), dtype=torch.bool).tril()
        scores = scores.masked_fill(keep.logical_not(), -math.inf)
    lse = torch.logsumexp(scores, -1)
    return torch.exp(scores - lse.unsqueeze(-1)), lse


def _kept(seed: torch.Tensor, shape: torch.Size, p: float) -> torch.Tensor | float:
    """Dropout's scaled mask, drawn again from the op's seed (1 without dropout)."""
    if p == 0.0:
        return 1.0
    gen = torch.Generator().manual_seed(int(seed.reshape(-1)[0]))
    return (torch.rand(shape, generator=gen) >= p).float() / (1.0 - p)


def _forward(q, k, v, bias, p, causal, scale):  # type: ignore[no-untyped-def]
    """(out, lse (B, H, Sq) float32, seed): one host attention."""
    seed = torch.randint(0, 2**62, (), dtype=torch.int64)  # the device's generator
    probs, lse = _probabilities(q, k, bias, causal, scale)
    probs = probs * _kept(seed, probs.shape, p)
    out = torch.matmul(probs, _grouped(q, v).float()).to(q.dtype)
    return out, lse, seed


def _backward(dout, q, k, v, bias, p, causal, scale, seed):  # type: ignore[no-untyped-def]
    """(dq, dk, dv) by the softmax's formula, the forward recomputed."""
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    probs, _ = _probabilities(q, k, bias, causal, scale)
    kept = _kept(seed, probs.shape, p)
    dout = dout.float()
    dv = torch.matmul((probs * kept).transpose(-2, -1), dout)
    dprobs = torch.matmul(dout, _grouped(q, v).float().transpose(-2, -1)) * kept
    dscores = probs * (dprobs - (dprobs * probs).sum(-1, keepdim=True))
    dq = torch.matmul(dscores, _grouped(q, k).float()) * scale
    dk = torch.matmul(dscores.transpose(-2, -1), q.float()) * scale
    heads = k.size(1)  # each gradient in its input's layout, as CUDA's kernels
    return (  # allocate them (empty_like)
        _like(q, dq.to(q.dtype)),
        _like(k, _folded(dk, heads).to(k.dtype)),
        _like(v, _folded(dv, heads).to(v.dtype)),
    )


def _like(q: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """`out` in the query's memory layout, as the CUDA kernels allocate it
    (`empty_like(query)`, `alloc_with_matching_layout`)."""
    return torch.empty_like(q).copy_(out) if q.shape == out.shape else out


def _long(value: int = 0) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.int64)


def _cudnn(q, k, v, bias, compute_lse, p=0.0, causal=False, debug=False, *, scale=None):  # type: ignore[no-untyped-def]
    out, lse, seed = _forward(q, k, v, bias, p, causal, scale)
    sq, sk = q.size(2), k.size(2)
    return _like(q, out), lse.unsqueeze(-1), None, None, sq, sk, seed, _long(), None


def _cudnn_backward(dout, q, k, v, out, lse, seed, offset, bias, *rest, scale=None):  # type: ignore[no-untyped-def]
    _cum_q, _cum_k, _max_q, _max_k, p, causal = rest
    return _backward(dout, q, k, v, bias, p, causal, scale, seed)


def _flash(q, k, v, p=0.0, causal=False, debug=False, *, scale=None):  # type: ignore[no-untyped-def]
    out, lse, seed = _forward(q, k, v, None, p, causal, scale)
    rng = torch.tensor([int(seed), 0], dtype=torch.uint64)  # Philox seed, offset
    unused = torch.zeros((), dtype=torch.uint64)
    empty = torch.empty(0, dtype=q.dtype)
    return _like(q, out), lse, None, None, q.size(2), k.size(2), rng, unused, empty


def _flash_backward(dout, q, k, v, out, lse, *rest, scale=None):  # type: ignore[no-untyped-def]
    _cum_q, _cum_k, _max_q, _max_k, p, causal, rng, _offset = rest
    return _backward(dout, q, k, v, None, p, causal, scale, rng.to(torch.int64))


def _efficient(q, k, v, bias, compute_lse, p=0.0, causal=False, *, scale=None):  # type: ignore[no-untyped-def]
    out, lse, seed = _forward(q, k, v, bias, p, causal, scale)
    padded = math.ceil(q.size(2) / 32) * 32 if compute_lse else 0
    full = torch.zeros(q.size(0), q.size(1), padded, dtype=torch.float32)
    full[..., : min(padded, q.size(2))] = lse[..., :padded]
    b, h, s, d = out.shape  # allocated (B, S, H, D) and transposed, as CUDA's
    out = torch.empty(b, s, h, d, dtype=out.dtype).transpose(1, 2).copy_(out)
    return out, full, seed, _long()


def _efficient_backward(
    dout, q, k, v, bias, out, lse, seed, offset, p, mask, causal=False, *, scale=None
):  # type: ignore[no-untyped-def]
    dq, dk, dv = _backward(dout, q, k, v, bias, p, causal, scale, seed)
    return dq, dk, dv, None


HOST_KERNELS = {
    "_scaled_dot_product_cudnn_attention": _cudnn,
    "_scaled_dot_product_cudnn_attention_backward": _cudnn_backward,
    "_scaled_dot_product_flash_attention": _flash,
    "_scaled_dot_product_flash_attention_backward": _flash_backward,
    "_scaled_dot_product_efficient_attention": _efficient,
    "_scaled_dot_product_efficient_attention_backward": _efficient_backward,
}


def register(library: torch.library.Library) -> None:
    """Register the CUDA composite for the device and host kernels of CUDA's
    attention ops in `library` (an aten IMPL library)."""
    warnings.filterwarnings("ignore", "Dropout mask should only be used for testing")
    library.impl("scaled_dot_product_attention", attention, "AutogradPrivateUse1")
    for name, kernel in HOST_KERNELS.items():
        library.impl(name, kernel, "CPU")
