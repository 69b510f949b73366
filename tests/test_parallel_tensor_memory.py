"""A block's activation memory: saved-tensor hooks measure exactly what the formula
of `parallel.tensor.memory` says, on one process and on real gloo ranks with tensor
parallelism, with and without sequence parallelism; bad sizes are refused."""

from __future__ import annotations

import pytest
import torch

from distcourse import plan
from distcourse.examples.gpt import Block, GPTConfig, TinyGPT, lm_loss, token_batches
from distcourse.launch import spawn
from distcourse.parallel.tensor import (
    block_activation_bytes,
    block_memory,
    fused_attention_lse_bytes,
    korthikanti_bytes,
    layer_activation_bytes,
    parallelize_block,
    saved_activation_bytes,
    step_activation_bytes,
)

B, T, H, HEADS = 2, 8, 16, 4


def _block() -> tuple[Block, torch.Tensor]:
    torch.manual_seed(0)  # the same block and input on every rank
    return Block(GPTConfig(n_embd=H, n_head=HEADS)), torch.randn(B, T, H)


def test_one_process_keeps_16h_plus_a_plus_4_values_per_token() -> None:
    block, x = _block()
    measured, formula = block_memory(block, block, x)
    assert measured == formula
    assert sum(formula.values()) == B * T * (16 * H + HEADS + 4) * 4


def _on_ranks() -> list[tuple[dict[str, int], dict[str, int]]]:
    block, x = _block()
    pairs = []
    for sp in (False, True):
        twin = parallelize_block(block, sequence_parallel=sp)
        pairs.append(block_memory(block, twin, x, sequence_parallel=sp))
    return pairs


def test_tensor_and_sequence_parallel_measure_the_formula_on_real_ranks() -> None:
    for rank, pairs in enumerate(spawn(_on_ranks, 2, timeout=20)):
        for measured, formula in pairs:
            assert measured == formula, (rank, measured, formula)
    (tp, _), (sp, _) = pairs
    one = block_activation_bytes(B, T, H, HEADS)
    assert tp["ln1"] == one["ln1"] and sp["ln1"] == one["ln1"] // 2  # norms split
    assert sp["mlp"] == tp["mlp"] < one["mlp"]  # the gathered input stays whole


def test_the_formula_refuses_sizes_that_do_not_split() -> None:
    with pytest.raises(ValueError, match="heads=4 is not divisible"):
        block_activation_bytes(B, T, H, 4, 3)
    with pytest.raises(ValueError, match="seq=7 is not divisible"):
        block_activation_bytes(B, 7, H, 4, 2, sequence_parallel=True)


def test_korthikanti_divides_everything_by_t_with_sequence_parallelism() -> None:
    s, b, h, a = 2048, 1, 12288, 96
    alone = korthikanti_bytes(b, s, h, a)
    assert alone == s * b * h * (34 + 5 * a * s / h)
    assert korthikanti_bytes(b, s, h, a, 8, sp=True) == pytest.approx(alone / 8)


def test_the_general_formula_is_korthikantis_under_the_papers_assumptions() -> None:
    s, b, h, a = 2048, 1, 12288, 96  # 16-bit values, 1-byte masks, scores kept
    paper = dict(value_bytes=2, mask_bytes=1, scores_kept=True, norm_stats=False)
    for t, sp in ((1, False), (8, False), (8, True)):
        got = layer_activation_bytes(
            b, s, h, a, t, sequence_parallel=sp, keep_gathered=False, **paper
        )
        assert sum(got.values()) == korthikanti_bytes(b, s, h, a, t, sp)
    selective = layer_activation_bytes(b, s, h, a, recompute="selective", **paper)
    assert sum(selective.values()) == 34 * s * b * h  # the paper's sbh 34
    full = layer_activation_bytes(b, s, h, a, 8, sequence_parallel=True, **paper)
    assert full["scores"] == s * b * h * 5 * a * s / h / 8


def test_the_general_formula_is_ours_and_measures_dropouts_masks() -> None:
    block, x = _block()
    for t, sp in ((1, False), (4, False), (4, True)):
        ours = layer_activation_bytes(B, T, H, HEADS, t, sequence_parallel=sp)
        assert sum(ours.values()) == sum(
            block_activation_bytes(B, T, H, HEADS, t, sequence_parallel=sp).values()
        )
    torch.manual_seed(0)
    dropping = Block(GPTConfig(n_embd=H, n_head=HEADS, dropout=0.1))
    measured = saved_activation_bytes(dropping, x.clone().requires_grad_())
    # on CPU, torch's dropout keeps a mask as wide as the values (4 bytes, not 1)
    want = layer_activation_bytes(B, T, H, HEADS, mask_bytes=4)
    assert sum(measured.values()) == sum(want.values())
    with pytest.raises(ValueError, match="recompute must be one of"):
        layer_activation_bytes(B, T, H, HEADS, recompute="some")


def test_cuda_counts_what_torchs_shape_function_for_its_kernel_makes() -> None:
    """No GPU here: the CUDA count is checked against the shapes torch's meta kernel
    of `_scaled_dot_product_efficient_attention` gives (the log-sum-exp, the seed
    and the offset its backward keeps beside q, k, v and the output)."""
    efficient = torch.ops.aten._scaled_dot_product_efficient_attention
    for b, heads, seq in ((2, 4, 8), (1, 3, 40), (4, 1, 32)):
        q = torch.empty(b, heads, seq, 16, device="meta")
        _, *kept = efficient(q, q, q, None, True)
        want = sum(t.numel() * t.element_size() for t in kept)
        assert fused_attention_lse_bytes(b, heads, seq, device_type="cuda") == want
        assert fused_attention_lse_bytes(b, heads, seq) == b * heads * seq * 4
    cpu = layer_activation_bytes(B, T, H, HEADS, 2)
    cuda = layer_activation_bytes(B, T, H, HEADS, 2, device_type="cuda")
    assert cuda["scores"] - cpu["scores"] == B * HEADS // 2 * (32 - T) * 4 + 16
    for t, sp in ((1, False), (4, False), (4, True)):  # the two formulas agree
        options = dict(sequence_parallel=sp, device_type="cuda")
        ours = layer_activation_bytes(B, T, H, HEADS, t, **options)
        block = block_activation_bytes(B, T, H, HEADS, t, **options)
        assert sum(ours.values()) == sum(block.values())
    selective = layer_activation_bytes(B, T, H, HEADS, recompute="selective")
    cuda = layer_activation_bytes(
        B, T, H, HEADS, recompute="selective", device_type="cuda"
    )
    assert selective == cuda  # the recomputed core keeps neither


def test_a_whole_steps_activations_equal_the_planners() -> None:
    cfg = GPTConfig(vocab=32, block_size=8, n_layer=2, n_head=2, n_embd=16)
    torch.manual_seed(0)
    x, y = token_batches(1, 4, cfg)[0]
    x = x.contiguous()  # a slice would count its whole storage
    got = step_activation_bytes(TinyGPT(cfg), lambda m: lm_loss(m(x), y))
    fp32 = plan.DTypePolicy("fp32", "fp32", "adamw")
    layout = plan.PlanLayout(dp=1)
    want = plan.predict(
        plan.ModelSpec.from_config(cfg), 4, fp32, layout, plan.named("h100")
    )
    assert got == want.memory["activations"]
