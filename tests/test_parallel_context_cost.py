"""What one process's fused attention keeps for backward, the reference chapter
12b's memory check divides: measured on the CPU's kernel, and for CUDA's kernel
checked against torch's own shape function of it (no GPU here); and the defaults of
torch's context_parallel that the chapter states, read from the installed torch."""

from __future__ import annotations

import inspect

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


def test_torchs_context_parallel_defaults_are_what_the_chapter_says() -> None:
    """torch's context_parallel (the chapter's "Side by side"): K/V all-gathered by
    default, dK/dV passed on step by step whatever the method, and its load
    balancer, on by default, refusing a non-causal mask. Read from the installed
    torch, so a torch that changes them fails here first."""
    from torch.distributed.tensor.experimental._context_parallel import (
        _attention as cp,
    )

    assert cp._cp_options.rotate_method == cp._RotateMethod.ALL_GATHER
    assert cp._cp_options.enable_load_balance is True
    gather = inspect.getsource(cp._AllGatherRotater)
    assert "Only one communication will be done" in gather
    backward = inspect.getsource(cp._templated_ring_attention_backward)
    assert "_create_rotater(group, 2, method=_RotateMethod.ALL_TO_ALL)" in backward
    refusal = 'raise RuntimeError("Load balancing requires `is_causal=True`.")'
    assert refusal in backward
    assert refusal in inspect.getsource(cp._templated_ring_attention)
    assert callable(cp.set_rotate_method)
