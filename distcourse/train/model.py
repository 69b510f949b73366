"""The trainer's model: TinyGPT at any size, drawn by name, and what a token costs.

Sizes by preset or by flag (`--model`, `--n-layer --n-embd --n-head --seq`):

    tiny       4 blocks x 32 wide, 4 heads, 32 tokens   chapter 13's quick runs
    gpt2-124m  12 x 768, 12 heads, 1024 tokens          GPT-2 small's shape
    gpt2-350m  24 x 1024, 16 heads, 1024 tokens         GPT-2 medium's shape
    1b         24 x 2048, 16 heads, 2048 tokens         1.3 B with a 32k vocabulary

The vocabulary is the corpus's (its tokenizer's, padded to a multiple of 64 so
every TP degree up to 64 splits it). TinyGPT differs from GPT-2 in two ways that
change the count, not the shape: its head is not tied to the token embedding, and
its projections have biases. With a 32,000-token vocabulary "gpt2-124m" has 135 M
parameters (the count the issue's H200 baseline ran).

Initialisation (`init_weights`): GPT-2's, by parameter name. Linear weights and
embeddings N(0, 0.02), the two residual projections (attn.proj, mlp.proj)
N(0, 0.02 / sqrt(2 L)), biases 0, norms 1 and 0. Each tensor is drawn from its own
generator seeded by (seed, name), so a rank that builds only its pipeline stage
draws exactly what one process draws for the same names.

FLOPs (`flops_per_token`): 6 per parameter a matmul reads (forward 2, backward 4:
the blocks' Linear weights and the head; embeddings are lookups) plus attention's
12 L T C (QK^T and AV, forward and backward, causal mask not subtracted), the
count nanoGPT and PaLM use for MFU.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from distcourse.examples.gpt import GPTConfig, TinyGPT

VOCAB_MULTIPLE = 64  # the vocabulary padded so TP up to 64 splits it


@dataclass(frozen=True)
class Preset:
    """A model shape: blocks, width, heads and the longest sequence."""

    n_layer: int
    n_embd: int
    n_head: int
    seq: int


PRESETS = {
    "tiny": Preset(4, 32, 4, 32),
    "gpt2-124m": Preset(12, 768, 12, 1024),
    "gpt2-350m": Preset(24, 1024, 16, 1024),
    "1b": Preset(24, 2048, 16, 2048),
}


def padded_vocab(vocab: int, multiple: int = VOCAB_MULTIPLE) -> int:
    """`vocab` rounded up to a multiple of `multiple`."""
    return -(-vocab // multiple) * multiple


def config(
    preset: str,
    vocab: int,
    *,
    n_layer: int | None = None,
    n_embd: int | None = None,
    n_head: int | None = None,
    seq: int | None = None,
) -> GPTConfig:
    """The preset's shape, each size overridden where given, with `vocab` tokens
    (padded). ValueError naming an unknown preset."""
    if preset not in PRESETS:
        raise ValueError(f"--model {preset}: use one of {', '.join(PRESETS)}")
    p = PRESETS[preset]
    return GPTConfig(
        vocab=padded_vocab(vocab),
        block_size=seq or p.seq,
        n_layer=n_layer or p.n_layer,
        n_head=n_head or p.n_head,
        n_embd=n_embd or p.n_embd,
    )


def _std(name: str, n_layer: int) -> float | None:
    """GPT-2's standard deviation for a weight named `name`; None for a norm."""
    if ".ln" in name or name.startswith("ln_f"):
        return None
    if name.endswith("proj.weight"):  # a residual projection
        return 0.02 / math.sqrt(2 * n_layer)
    return 0.02


def init_weights(seed: int, n_layer: int) -> Callable[[str, Tensor], None]:
    """`init(name, tensor)`: fill one-process parameter `name` in place, from a
    generator seeded by (seed, name) on the host (then copied to its device)."""

    def init(name: str, tensor: Tensor) -> None:
        std = _std(name, n_layer)
        with torch.no_grad():
            if name.endswith("bias"):
                tensor.zero_()
            elif std is None:  # a norm's weight
                tensor.fill_(1.0)
            else:
                gen = torch.Generator().manual_seed(
                    seed * 1_000_003 + zlib.crc32(name.encode())
                )
                drawn = torch.empty(tensor.shape, dtype=torch.float32)
                drawn.normal_(0.0, std, generator=gen)
                tensor.copy_(drawn)

    return init


def on_meta(cfg: GPTConfig) -> TinyGPT:
    """The model's shape and nothing else: every tensor on the meta device."""
    with torch.device("meta"):
        return TinyGPT(cfg)


def one_process(
    cfg: GPTConfig, seed: int, device: torch.device | str = "cpu"
) -> TinyGPT:
    """The whole model on `device`, drawn as `init_weights` draws it."""
    model = on_meta(cfg).to_empty(device=device)
    init = init_weights(seed, cfg.n_layer)
    for name, p in model.named_parameters():
        init(name, p)
    return model


def parameters(cfg: GPTConfig) -> int:
    """Parameters of TinyGPT of shape `cfg`."""
    return sum(p.numel() for p in on_meta(cfg).parameters())


def flops_per_token(cfg: GPTConfig, seq: int | None = None) -> int:
    """Training FLOPs per token (forward and backward): 6 x the parameters the
    matmuls read (blocks' Linear weights, the head) + 12 L T C (attention's
    scores and weighted sum) at sequence length `seq` (default block_size)."""
    C, L, T = cfg.n_embd, cfg.n_layer, seq or cfg.block_size
    matmul = (
        L * 12 * C * C + cfg.vocab * C
    )  # q, k, v, proj (4 C^2), fc and proj (8 C^2)
    return 6 * matmul + 12 * L * T * C
