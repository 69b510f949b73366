"""The tiny GPT as a chain of layers, cut into pipeline stages, each split by TP.

TinyGPT's forward is embeddings -> blocks -> norm and head. As a chain:

    Embed (tok + pos)  Block 0 ... Block L-1  Head (ln_f + head)

Stage s of pp gets L / pp blocks; the first stage also the embeddings, the last
the head (Megatron's and picotron's cut). `parallelize_stage` then splits each
layer across the tensor-parallel group with chapter 4's pieces: the token
embedding by vocabulary, each block as parallelize_block does, the head by output
(its logits stay split: the loss is vocab_parallel_cross_entropy).
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from distcourse.comm.agree import Group
from distcourse.examples.gpt import TinyGPT
from distcourse.parallel.pipeline import split_at
from distcourse.parallel.tensor import (
    ColumnParallelLinear,
    VocabParallelEmbedding,
    full_state_dict,
    parallelize_block,
)


class Embed(nn.Module):
    """Token + position embeddings: ids (B, T) -> (B, T, C), as TinyGPT begins."""

    def __init__(self, model: TinyGPT) -> None:
        super().__init__()
        self.tok, self.pos, self.drop = model.tok, model.pos, model.drop

    def forward(self, idx: Tensor) -> Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        return self.drop(self.tok(idx) + self.pos(positions))  # (B, T, C)


class Head(nn.Module):
    """Final norm and head: (B, T, C) -> logits (B, T, vocab), as TinyGPT ends."""

    def __init__(self, model: TinyGPT) -> None:
        super().__init__()
        self.ln_f, self.head = model.ln_f, model.head

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.ln_f(x))


def as_chain(model: TinyGPT) -> nn.Sequential:
    """TinyGPT as an nn.Sequential of L + 2 layers (sharing its parameters)."""
    return nn.Sequential(Embed(model), *model.blocks, Head(model))


def bounds(n_layer: int, pp: int) -> list[int]:
    """Cut points in the chain: the embeddings go with the first L / pp blocks, the
    head with the last. 2 blocks, 2 stages: [0, 2, 4] (Embed+B0 | B1+Head)."""
    per = n_layer // pp
    return [0] + [1 + s * per for s in range(1, pp)] + [n_layer + 2]


def stages(model: TinyGPT, pp: int) -> list[nn.Sequential]:
    """The chain of a copy of `model`, cut into pp stages (n_layer % pp == 0)."""
    if model.cfg.n_layer % pp:
        raise ValueError(
            f"n_layer={model.cfg.n_layer} blocks do not divide into "
            f"pp={pp} pipeline stages"
        )
    return split_at(as_chain(copy.deepcopy(model)), bounds(model.cfg.n_layer, pp))


def parallelize_stage(
    stage: nn.Sequential, group: Group, *, check: bool = True
) -> nn.Sequential:
    """A copy of `stage` with every layer split across the tensor-parallel `group`."""
    out = copy.deepcopy(stage)
    for i, layer in enumerate(stage):
        if isinstance(layer, Embed):
            out[i].tok = VocabParallelEmbedding.from_embedding(
                layer.tok, group, check=check
            )
        elif isinstance(layer, Head):
            out[i].head = ColumnParallelLinear.from_linear(
                layer.head, group, check=check
            )
        else:
            out[i] = parallelize_block(layer, group, check=check)
    return out


def layer_prefix(index: int, n_layer: int) -> str:
    """Where chain layer `index` lives in TinyGPT's state dict: '', 'blocks.k.'."""
    return "" if index in (0, n_layer + 1) else f"blocks.{index - 1}."


def one_process_state(
    stage: nn.Sequential, first: int, n_layer: int
) -> dict[str, Tensor]:
    """The full parameters of a (possibly split) stage whose first layer is chain
    layer `first`, under TinyGPT's names. A collective over the stage's TP group:
    split layers gather their pieces."""
    state = {}
    for i, layer in enumerate(stage):
        prefix = layer_prefix(first + i, n_layer)
        state.update({prefix + k: v for k, v in full_state_dict(layer).items()})
    return state
