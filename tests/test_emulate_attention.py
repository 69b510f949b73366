"""SDPA on the emulated GPU (distcourse/emulate/attention.py): the kernel CUDA runs
(distcourse.sdpa), keeping what that kernel keeps, with the gradients of the math."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from distcourse import emulate, sdpa
from distcourse.emulate import attention

emulate.setup()
GPU = torch.device(emulate.DEVICE_TYPE, 0)
B, H, S = 2, 4, 16


def _run(device: torch.device, dtype: torch.dtype, head: int, **kw) -> tuple:
    """(bytes kept beyond q, k, v and the output, op names saved from, output,
    gradients) of one causal attention and its backward on `device`."""
    torch.manual_seed(0)
    q, k, v = (
        torch.randn(B, H, S, head).to(dtype).to(device).requires_grad_() for _ in "qkv"
    )
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, **kw)
    out.float().square().sum().backward()
    grads = [t.grad.float().cpu() for t in (q, k, v)]
    return sum(kept.values()), out.float().detach().cpu(), grads, q


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head", [2, 8, 64])
def test_the_kernel_cuda_chooses_keeps_what_it_keeps(dtype, head) -> None:
    kernel = sdpa.choose_kernel("cuda", dtype, head, causal=True)
    kept, out, grads, q = _run(GPU, dtype, head)
    each = q.untyped_storage().nbytes()
    extra = sum(sdpa.saved_bytes(kernel, B, H, S, head, dtype).values())
    if kernel == "flash" and head % 8:  # no projection here to copy the output
        extra -= each
    base = 3 * each if kernel == "math" else 4 * each  # math keeps no output
    assert kept == base + extra, kernel
    ref_kept, ref_out, ref_grads, _ = _run(torch.device("cpu"), torch.float32, head)
    tol = 1e-5 if dtype == torch.float32 else 5e-2
    assert (out - ref_out).abs().max() <= tol * ref_out.abs().max()
    for got, want in zip(grads, ref_grads, strict=True):
        assert (got - want).abs().max() <= tol * max(1.0, want.abs().max())


def test_the_h200s_choices_are_the_emulated_ones() -> None:
    """Head size 8 in bf16 ran cuDNN on the H200; head size 2 in fp32, the math path."""
    q = torch.randn(B, H, S, 8, device=GPU, dtype=torch.bfloat16)
    assert attention.kernel_for(q, q, q, None, 0.0, True, False) == "cudnn"
    q = torch.randn(B, H, S, 2, device=GPU)
    assert attention.kernel_for(q, q, q, None, 0.0, True, False) == "math"
    with sdpa_kernel(SDPBackend.MATH):  # torch's switches are obeyed
        q = torch.randn(B, H, S, 8, device=GPU, dtype=torch.bfloat16)
        assert attention.kernel_for(q, q, q, None, 0.0, True, False) == "math"


def test_masks_dropout_and_grouped_heads_run_their_kernels() -> None:
    torch.manual_seed(0)
    q = torch.randn(B, H, S, 8, dtype=torch.bfloat16).to(GPU).requires_grad_()
    kv = torch.randn(B, 2, S, 8, dtype=torch.bfloat16).to(GPU).requires_grad_()
    mask = torch.ones(S, S, dtype=torch.bool).tril().to(GPU)
    with_mask = F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
    causal = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert (with_mask.float() - causal.float()).abs().max().item() < 1e-2
    grouped = F.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)
    ref = F.scaled_dot_product_attention(
        q.detach().cpu().float(),
        kv.detach().cpu().float().repeat_interleave(2, 1),
        kv.detach().cpu().float().repeat_interleave(2, 1),
        is_causal=True,
    )
    assert (grouped.float().cpu() - ref).abs().max().item() < 5e-2
    grouped.float().sum().backward()
    assert kv.grad.shape == kv.shape
    # dropout: the backward replays the forward's mask (the gradient of a linear
    # function of v equals its forward's coefficients)
    v = torch.randn(B, H, S, 8, dtype=torch.bfloat16).to(GPU).requires_grad_()
    out = F.scaled_dot_product_attention(q.detach(), q.detach(), v, dropout_p=0.5)
    (out.float() * 1.0).sum().backward()
    probs = F.scaled_dot_product_attention(  # the same draw cannot be made twice:
        q.detach(), q.detach(), torch.eye(S).expand(B, H, S, S).to(GPU).bfloat16()
    )  # check the gradient is finite, non-zero and not the undropped one
    assert torch.isfinite(v.grad.float()).all()
    undropped = probs.float().sum(-2).unsqueeze(-1).expand(B, H, S, 8)
    assert (v.grad.float() - undropped).abs().max().item() > 1e-2


def test_a_bf16_block_keeps_what_cuda_keeps() -> None:
    """Block(16 wide, 8 heads of 2) in bf16, batch 2 of 8 tokens: flash pads the
    heads to 8 (sdpa's "padding"), and layer norm keeps float32 statistics as CUDA's
    kernel does (the CPU's keeps them in bf16: 576 bytes, not 640)."""
    from distcourse.examples.gpt import Block, GPTConfig
    from distcourse.parallel.tensor.memory import saved_activation_bytes

    torch.manual_seed(0)
    block = Block(GPTConfig(n_embd=16, n_head=8)).to(GPU).to(torch.bfloat16)
    x = torch.randn(2, 8, 16).to(GPU).to(torch.bfloat16).requires_grad_()
    kept = saved_activation_bytes(block, x)
    one = 2 * 8 * 16 * 2  # one bf16 activation of the block
    flash = sdpa.saved_bytes("flash", 2, 8, 8, 2, torch.bfloat16)
    assert kept["attn"] == one + 4 * one + sum(flash.values()) == 9752
    assert kept["ln1"] == one + 2 * (2 * 8) * 4 == 640  # input, float32 mean, rstd
    norm = torch.nn.LayerNorm(16).to(GPU).to(torch.bfloat16)
    out, mean, rstd = torch.ops.aten.native_layer_norm(
        x, (16,), norm.weight, None, 1e-5
    )
    assert (out.dtype, mean.dtype, rstd.dtype) == (torch.bfloat16, *[torch.float32] * 2)
    norm(x).float().sum().backward()
    assert x.grad.dtype == norm.weight.grad.dtype == torch.bfloat16
