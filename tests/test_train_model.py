"""The trainer's model: presets, GPT-2's initialisation drawn by name (a stage
drawn alone equals one process's), and FLOPs per token equal to what torch's
FLOP counter counts in a step (less the attention's recompute in backward)."""

from __future__ import annotations

import pytest
import torch

from distcourse.examples.gpt import GPTConfig, lm_loss
from distcourse.parallel.checkpointing import step_flops
from distcourse.parallel.hybrid.build import own_stages
from distcourse.train import model as model_mod

CFG = GPTConfig(vocab=64, block_size=16, n_layer=2, n_head=4, n_embd=32)


def test_presets_and_sizes() -> None:
    small = model_mod.config("gpt2-124m", 32000)
    assert (small.n_layer, small.n_embd, small.n_head, small.block_size) == (
        12,
        768,
        12,
        1024,
    )
    assert model_mod.parameters(small) == 134_994_432  # the 135M baseline
    assert model_mod.config("tiny", 100, seq=8, n_layer=2) == GPTConfig(
        vocab=128, block_size=8, n_layer=2, n_head=4, n_embd=32
    )
    assert model_mod.padded_vocab(50257) == 50304  # nanoGPT's padding too
    with pytest.raises(ValueError, match="--model huge: use one of tiny"):
        model_mod.config("huge", 10)


def test_gpt2_initialisation_by_name() -> None:
    model = model_mod.one_process(CFG, seed=0)
    state = model.state_dict()
    assert torch.equal(state["blocks.0.ln1.weight"], torch.ones(32))
    assert not state["blocks.1.mlp.fc.bias"].any()
    assert abs(state["tok.weight"].std().item() - 0.02) < 2e-3
    proj = state["blocks.0.attn.proj.weight"].std().item()
    assert abs(proj - 0.02 / 2) < 2e-3  # 0.02 / sqrt(2 L), L = 2
    again = model_mod.one_process(CFG, seed=0).state_dict()
    other = model_mod.one_process(CFG, seed=1).state_dict()
    assert all(torch.equal(v, again[k]) for k, v in state.items())
    assert not torch.equal(state["head.weight"], other["head.weight"])


def test_a_stage_drawn_alone_equals_one_process() -> None:
    whole = model_mod.one_process(CFG, seed=0).state_dict()
    init = model_mod.init_weights(0, CFG.n_layer)
    (last,) = own_stages(
        model_mod.on_meta(CFG), 2, [1], torch.device("cpu"), init
    ).values()
    mine = dict(last.named_parameters())  # block 1, then ln_f and head
    assert torch.equal(mine["0.attn.query.weight"], whole["blocks.1.attn.query.weight"])
    assert torch.equal(mine["1.head.weight"], whole["head.weight"])


def test_flops_per_token_are_what_torch_counts() -> None:
    model = model_mod.one_process(CFG, seed=0)
    x = torch.randint(0, CFG.vocab, (3, CFG.block_size))
    counted = step_flops(lambda: lm_loss(model(x), x))
    B, T, C, L = *x.shape, CFG.n_embd, CFG.n_layer
    # torch counts the fused attention's backward with its recompute of the
    # scores (Q K^T again, 2 B T^2 C a block): work done, not model FLOPs
    recompute = L * 2 * B * T * T * C
    assert counted == model_mod.flops_per_token(CFG) * x.numel() + recompute
