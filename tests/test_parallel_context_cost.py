"""What one process's fused attention keeps for backward, the reference chapter
12b's memory check divides: measured on the CPU's kernel, and for CUDA's kernel
checked against torch's own shape function of it (no GPU here)."""

from __future__ import annotations

import pytest
import torch

from distcourse.parallel import context as cpx
from distcourse.parallel.context import check

SHAPES = [(2, 2, 16, 4), (1, 3, 40, 8), (4, 1, 32, 16)]


@pytest.mark.parametrize("shape", SHAPES)
def test_the_cpu_kernel_keeps_q_k_v_out_and_one_lse_a_token(shape: tuple) -> None:
    measured = check.full_attention_kept(shape, device="cpu")
    assert measured == cpx.full_attention_formula(*shape)
    B, H, T, D = shape
    for cp in (1, 2, 4):
        if T % (2 * cp) == 0:  # a rank of ring attention keeps exactly 1/cp of it
            assert cpx.saved_bytes_formula(B, H, T, D, cp) * cp == measured


@pytest.mark.parametrize("shape", SHAPES)
def test_the_cuda_count_is_what_torchs_shape_function_makes(shape: tuple) -> None:
    """The tensors the memory-efficient kernel returns are what its backward keeps
    (q, k, v as given); their shapes come from torch's meta kernel, runnable here."""
    q = torch.empty(shape, device="meta")
    efficient = torch.ops.aten._scaled_dot_product_efficient_attention
    out, lse, seed, offset = efficient(q, q, q, None, True, 0.0, True)
    made = [q, q, q, out, lse, seed, offset]  # seed, offset: 0-d int64 tensors
    want = sum(t.numel() * t.element_size() for t in made)
    assert cpx.full_attention_formula(*shape, device_type="cuda") == want
    B, H, T, _ = shape
    padding = B * H * (-T % 32) * 4
    cpu = cpx.full_attention_formula(*shape)
    assert want - cpu == padding + 16  # the padded log-sum-exp, the seed, the offset
