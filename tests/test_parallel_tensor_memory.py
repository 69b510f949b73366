"""A block's activation memory: saved-tensor hooks measure exactly what the formula
of `parallel.tensor.memory` says, in fp32, bf16 and under bf16 autocast, on one
process and on real gloo ranks with tensor parallelism, with and without sequence
parallelism; the attention term is the kernel torch picks (`distcourse.sdpa`) for
the device, dtype and head size; bad sizes are refused."""

from __future__ import annotations

import pytest
import torch

from distcourse import plan, sdpa
from distcourse.examples.gpt import Block, GPTConfig, TinyGPT, lm_loss, token_batches
from distcourse.launch import spawn
from distcourse.parallel.tensor import (
    Precision,
    block_activation_bytes,
    block_memory,
    korthikanti_bytes,
    layer_activation_bytes,
    parallelize_block,
    saved_activation_bytes,
    step_activation_bytes,
)

B, T, H, HEADS = 2, 8, 16, 4
POLICIES = ("fp32", "bf16", "amp-bf16")


def _block(policy: str = "fp32") -> tuple[Block, torch.Tensor]:
    torch.manual_seed(0)  # the same block and input on every rank
    block, x = Block(GPTConfig(n_embd=H, n_head=HEADS)), torch.randn(B, T, H)
    if policy == "bf16":  # bf16 weights and values, no autocast
        return block.to(torch.bfloat16), x.to(torch.bfloat16)
    return block, x


def _measured(policy: str, *args, **kwargs) -> tuple[dict, dict]:  # noqa: ANN002, ANN003
    """block_memory(*args) run under bf16 autocast for amp-bf16."""
    with torch.autocast("cpu", torch.bfloat16, enabled=policy == "amp-bf16"):
        return block_memory(*args, **kwargs)


def test_one_process_keeps_16h_plus_a_plus_4_values_per_token() -> None:
    block, x = _block()
    measured, formula = block_memory(block, block, x)
    assert measured == formula
    assert sum(formula.values()) == B * T * (16 * H + HEADS + 4) * 4


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize(("width", "heads"), [(16, 8), (64, 8), (512, 8)])
def test_every_policy_and_head_size_keeps_the_formulas_bytes(
    policy: str, width: int, heads: int
) -> None:
    """Head sizes 2, 8 and 64 in fp32, bf16 (bf16 weights) and bf16 autocast
    (fp32 weights: the residual stream and norms in fp32, the casts kept)."""
    torch.manual_seed(0)
    block, x = Block(GPTConfig(n_embd=width, n_head=heads)), torch.randn(B, T, width)
    if policy == "bf16":
        block, x = block.to(torch.bfloat16), x.to(torch.bfloat16)
    measured, formula = _measured(policy, block, block, x)
    assert measured == formula, (policy, width, measured, formula)


def test_autocast_keeps_fp32_norms_three_casts_and_the_weights() -> None:
    """amp-bf16 against fp32, term by term: the norms the same (fp32 residual
    stream), attention's input kept three times at 2 bytes (q, k and v each cast
    it), every matmul output halved, and the bf16 weight casts kept."""
    one, amp = (
        block_activation_bytes(B, T, H, HEADS, precision=Precision(p, "cpu"))
        for p in ("fp32", "amp-bf16")
    )
    n, lse = B * T, B * HEADS * T * 4
    assert amp["ln1"] == one["ln1"] == n * (4 * H + 8)
    assert amp["attn"] == n * (3 * 2 * H + 4 * 2 * H) + lse + 2 * 4 * H * H
    assert amp["mlp"] == n * (2 * H + 8 * 2 * H) + 2 * 8 * H * H


def _on_ranks() -> dict[str, list[tuple[dict[str, int], dict[str, int]]]]:
    out = {}
    for policy in POLICIES:
        block, x = _block(policy)
        out[policy] = []
        for sp in (False, True):
            twin = parallelize_block(block, sequence_parallel=sp)
            pair = _measured(policy, block, twin, x, sequence_parallel=sp)
            out[policy].append(pair)
    return out


def test_tensor_and_sequence_parallel_measure_the_formula_on_real_ranks() -> None:
    for rank, found in enumerate(spawn(_on_ranks, 2, timeout=30)):
        for policy, pairs in found.items():
            for measured, formula in pairs:
                assert measured == formula, (rank, policy, measured, formula)
    (tp, _), (sp, _) = found["fp32"]
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


# (dtype policy, head size) -> the kernel CUDA runs on an H100/H200 (sm90)
SM90 = {
    ("fp32", 2): "math",
    ("fp32", 8): "efficient",
    ("fp32", 64): "efficient",
    ("bf16", 2): "flash",
    ("bf16", 8): "cudnn",
    ("bf16", 64): "cudnn",
}


def test_cuda_attention_keeps_what_the_kernel_torch_picks_keeps() -> None:
    """No GPU here: on CUDA the attention term is `sdpa.saved_bytes` of the kernel
    `sdpa.choose_kernel` picks by dtype and head size (the math path's scores for
    head size 2 in fp32: the H200's 9216-byte block); the memory-efficient one
    equals the shapes torch's meta kernel gives (its padded log-sum-exp, seed and
    offset)."""
    for (policy, head), kernel in SM90.items():
        cuda = Precision(policy, "cuda")
        assert cuda.kernel(head) == kernel
        dtype = cuda.matmul_dtype
        want = sum(sdpa.saved_bytes(kernel, B, 4, T, head, dtype).values())
        assert cuda.attention(B, 4, T, head) == want, (policy, head)
    efficient = torch.ops.aten._scaled_dot_product_efficient_attention
    for b, heads, seq in ((2, 4, 8), (1, 3, 40), (4, 1, 32)):
        q = torch.empty(b, heads, seq, 16, device="meta")
        _, *kept = efficient(q, q, q, None, True)
        want = sum(t.numel() * t.element_size() for t in kept)
        assert Precision("fp32", "cuda").attention(b, heads, seq, 16) == want
        assert Precision("fp32", "cpu").attention(b, heads, seq, 16) == (
            b * heads * seq * 4
        )
    h200 = Precision("fp32", "cuda")  # the GPU suite's block: width 16, 8 heads
    assert block_activation_bytes(2, 8, 16, 8, precision=h200)["attn"] == 9216
    cpu = layer_activation_bytes(B, T, H, HEADS, 2)  # head size 4: efficient
    cuda = layer_activation_bytes(B, T, H, HEADS, 2, device_type="cuda")
    assert cuda["scores"] - cpu["scores"] == B * HEADS // 2 * (32 - T) * 4 + 16
    for t, sp in ((1, False), (4, False), (4, True)):  # the two formulas agree
        ours = layer_activation_bytes(
            B, T, H, HEADS, t, sequence_parallel=sp, device_type="cuda"
        )
        options = dict(sequence_parallel=sp, precision=Precision("fp32", "cuda"))
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
    here = plan.local(0.0, 0.0, 1e9, 2**30, 1)  # a CPU: its attention kernel
    want = plan.predict(plan.ModelSpec.from_config(cfg), 4, fp32, layout, here)
    assert got == want.memory["activations"]
