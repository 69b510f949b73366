"""A tiny GPT (pre-norm transformer decoder) and a token stream it can learn.

Small enough to train in seconds on CPU, real enough to split across ranks: separate
query/key/value projections (as torchtitan's, so heads split cleanly), an MLP of
4x width, learned positions, and a head that is a plain `nn.Linear`. The attention
reshapes with `view(B, T, -1, head_dim)`, never with `n_head`, so the same forward
runs on a rank that holds only some heads (ours and `parallelize_module`'s alike).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class GPTConfig:
    """Sizes of the tiny GPT; the defaults train in a few seconds on one core."""

    vocab: int = 64
    block_size: int = 16  # longest sequence
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 32
    dropout: float = 0.0


class MLP(nn.Module):
    """Linear(C, 4C) -> GELU -> Linear(4C, C)."""

    def __init__(self, n_embd: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.fc = nn.Linear(n_embd, 4 * n_embd)
        self.proj = nn.Linear(4 * n_embd, n_embd)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(F.gelu(self.fc(x))))


class SelfAttention(nn.Module):
    """Causal multi-head self-attention with separate query, key and value."""

    def __init__(self, n_embd: int, n_head: int, dropout: float = 0.0) -> None:
        super().__init__()
        if n_embd % n_head:
            raise ValueError(f"n_embd={n_embd} is not divisible by n_head={n_head}")
        self.n_head, self.head_dim = n_head, n_embd // n_head
        self.query = nn.Linear(n_embd, n_embd)
        self.key = nn.Linear(n_embd, n_embd)
        self.value = nn.Linear(n_embd, n_embd)
        self.proj = nn.Linear(n_embd, n_embd)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        # (B, T, heads * head_dim) -> (B, heads, T, head_dim); heads = what this holds
        q, k, v = (
            f(x).view(B, T, -1, self.head_dim).transpose(1, 2)
            for f in (self.query, self.key, self.value)
        )
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).reshape(B, T, -1)  # (B, T, heads * head_dim)
        return self.drop(self.proj(y))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln1(x)), then x + mlp(ln2(x))."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd)
        self.attn = SelfAttention(cfg.n_embd, cfg.n_head, cfg.dropout)
        self.ln2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = MLP(cfg.n_embd, cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """Token + position embeddings, `n_layer` blocks, a final norm and a linear head.

    `forward(idx)` maps token ids (B, T) to logits (B, T, vocab).
    """

    def __init__(self, cfg: GPTConfig = GPTConfig()) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.n_embd)
        self.pos = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.head = nn.Linear(cfg.n_embd, cfg.vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.shape[1]
        if T > self.cfg.block_size:
            raise ValueError(f"{T} tokens > block_size={self.cfg.block_size}")
        positions = torch.arange(T, device=idx.device)
        x = self.drop(self.tok(idx) + self.pos(positions))  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))  # (B, T, vocab)


def token_batches(
    steps: int, batch: int, cfg: GPTConfig = GPTConfig(), seed: int = 0
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`steps` batches (inputs, next tokens), each (batch, block_size), from a fixed
    random bigram table: each token is followed by one of 3 tokens with chances
    0.6, 0.3 and 0.1 (a loss of 0.9 nats is the best possible). The same on every
    rank and every run for the same seed."""
    gen = torch.Generator().manual_seed(seed)
    table = torch.zeros(cfg.vocab, cfg.vocab)
    nexts = torch.randint(0, cfg.vocab, (cfg.vocab, 3), generator=gen)
    table.scatter_add_(1, nexts, torch.tensor([[0.6, 0.3, 0.1]]).expand(cfg.vocab, 3))
    tokens = torch.empty(steps * batch, cfg.block_size + 1, dtype=torch.long)
    tokens[:, 0] = torch.randint(0, cfg.vocab, (len(tokens),), generator=gen)
    for t in range(cfg.block_size):
        nxt = torch.multinomial(table[tokens[:, t]], 1, generator=gen)
        tokens[:, t + 1] = nxt[:, 0]
    return [(s[:, :-1], s[:, 1:]) for s in tokens.split(batch)]


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of logits (B, T, vocab) against targets (B, T)."""
    return F.cross_entropy(logits.flatten(0, -2), targets.flatten())


def train_lm(
    model: nn.Module,
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = lm_loss,
    lr: float = 1e-2,
    optimizer_class: Callable[..., torch.optim.Optimizer] = torch.optim.AdamW,
) -> list[float]:
    """One optimizer step per batch (AdamW, or `optimizer_class(params, lr=lr)`);
    the loss of every step.

    `loss_fn(logits, targets)` is `lm_loss` for a whole model; a model whose logits
    are split (tensor parallelism) passes its own, e.g. a vocabulary-parallel one.
    AdamW divides each step by the gradient's size, so its losses hardly see a
    gradient of the wrong scale; plain SGD (`torch.optim.SGD`) steps by the gradient.
    """
    optimizer = optimizer_class(model.parameters(), lr=lr)
    losses = []
    for x, y in batches:
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses
