"""The tiny GPT and its token stream: shapes, causality, reproducible data, errors."""

from __future__ import annotations

import pytest
import torch

from distcourse.examples.gpt import (
    GPTConfig,
    SelfAttention,
    TinyGPT,
    lm_loss,
    token_batches,
)

CFG = GPTConfig()


def test_logits_have_one_row_per_token_and_ignore_the_future() -> None:
    torch.manual_seed(0)
    model = TinyGPT(CFG)
    x, y = token_batches(1, 3, CFG)[0]
    assert x.shape == y.shape == (3, CFG.block_size)
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the next tokens
    logits = model(x)
    assert logits.shape == (3, CFG.block_size, CFG.vocab)
    changed = x.clone()
    changed[:, -1] = (changed[:, -1] + 1) % CFG.vocab  # only the last token differs
    assert torch.equal(model(changed)[:, :-1], logits[:, :-1])  # causal
    assert abs(lm_loss(logits, y).item() - 4.2) < 0.5  # about ln(64) at the start


def test_token_batches_are_reproducible_and_learnable() -> None:
    a, b = token_batches(2, 4, CFG, seed=3), token_batches(2, 4, CFG, seed=3)
    assert all(torch.equal(a[i][j], b[i][j]) for i in range(2) for j in range(2))
    x, y = token_batches(50, 8, CFG)[0]
    pairs = torch.stack([x.flatten(), y.flatten()], 1).unique(dim=0)
    assert len(pairs) <= 3 * CFG.vocab  # at most 3 successors per token


def test_bad_sizes_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="n_embd=10 is not divisible by n_head=4"):
        SelfAttention(10, 4)
    with pytest.raises(ValueError, match="17 tokens > block_size=16"):
        TinyGPT(CFG)(torch.zeros(1, 17, dtype=torch.long))
