"""Activation checkpointing: full and selective policies compute the same gradients
as none, keep exactly the bytes `layer_activation_bytes` says (fused attention and
the math kernel's kept scores), add exactly the FLOPs they recompute, and do so on
a tensor-parallel block on real gloo ranks too."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import sdpa_flop_count

from distcourse.examples.gpt import Block, GPTConfig, TinyGPT, token_batches, train_lm
from distcourse.launch import spawn
from distcourse.parallel.checkpointing import (
    POLICIES,
    checkpoint_blocks,
    step_cost,
    step_flops,
    with_policy,
)
from distcourse.parallel.tensor import (
    layer_activation_bytes,
    parallelize_block,
    saved_activation_bytes,
)

B, T, H, HEADS = 2, 8, 16, 4


def _block() -> tuple[Block, torch.Tensor]:
    torch.manual_seed(0)
    return Block(GPTConfig(n_embd=H, n_head=HEADS)), torch.randn(B, T, H)


def _gradients(block: torch.nn.Module, x: torch.Tensor, policy: str) -> list:
    block.zero_grad()
    x = x.clone().requires_grad_()
    with_policy(block, policy)(x).square().sum().backward()
    return [x.grad, *(p.grad.clone() for p in block.parameters())]


def test_every_policy_keeps_the_formulas_bytes_and_the_same_gradients() -> None:
    block, x = _block()
    want = _gradients(block, x, "none")
    for kernel, kept in ((SDPBackend.FLASH_ATTENTION, False), (SDPBackend.MATH, True)):
        with sdpa_kernel(kernel):
            for policy in POLICIES:
                got = saved_activation_bytes(with_policy(block, policy), x)
                formula = layer_activation_bytes(
                    B, T, H, HEADS, scores_kept=kept, recompute=policy
                )
                assert sum(got.values()) == sum(formula.values()), (kernel, policy)
                for a, b in zip(_gradients(block, x, policy), want, strict=True):
                    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_recompute_adds_exactly_the_flops_it_runs_again() -> None:
    block, x = _block()
    x.requires_grad_()
    flops = {
        p: step_flops(lambda p=p: with_policy(block, p)(x).sum()) for p in POLICIES
    }
    core = sdpa_flop_count((B, HEADS, T, H // HEADS), *[(B, HEADS, T, H // HEADS)] * 2)
    assert flops["selective"] - flops["none"] == core
    # full: the forward again, but the last product (mlp.proj), whose saved input
    # is the last one backward needs, is not recomputed: torch stops early
    linears = 2 * B * T * (4 * H * H + 2 * 4 * H * H)
    assert flops["full"] - flops["none"] == core + linears - 2 * B * T * 4 * H * H
    cost = step_cost(lambda: block(x).sum(), repeats=1)
    assert cost["flops"] == flops["none"] and cost["seconds"] > 0


def test_a_checkpointed_tiny_gpt_trains_to_the_same_losses() -> None:
    batches = token_batches(3, 4)
    losses = {}
    for policy in POLICIES:
        torch.manual_seed(0)
        losses[policy] = train_lm(checkpoint_blocks(TinyGPT(), policy), batches)
    assert losses["full"] == pytest.approx(losses["none"], abs=1e-5)
    assert losses["selective"] == pytest.approx(losses["none"], abs=1e-5)
    with pytest.raises(ValueError, match="policy must be one of"):
        with_policy(Block(GPTConfig()), "half")


def _tensor_parallel() -> list[tuple[int, int, float]]:
    block, x = _block()
    want = _gradients(block, x, "none")[0]
    out = []
    for policy in POLICIES:
        twin = parallelize_block(block)
        got = sum(saved_activation_bytes(with_policy(twin, policy), x).values())
        grad = _gradients(twin, x, policy)[0]  # recompute reruns the all_reduce
        formula = sum(
            layer_activation_bytes(B, T, H, HEADS, 2, recompute=policy).values()
        )
        out.append((got, formula, (grad - want).abs().max().item()))
    return out


def test_policies_on_a_tensor_parallel_block_on_real_ranks() -> None:
    for rank in spawn(_tensor_parallel, 2, timeout=30):
        for got, formula, diff in rank:
            assert got == formula and diff < 1e-5
