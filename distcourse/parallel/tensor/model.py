"""Whole models split across ranks, and their checkpoints: the same state-dict keys.

`parallelize_gpt` turns a one-process `examples.gpt.TinyGPT` into its
tensor-parallel twin by swapping modules in a copy: each rank keeps its slice, the
forward is the model's own. The twin returns this rank's vocabulary slice of the
logits; its loss is `vocab_parallel_cross_entropy`. A checkpoint is the full state
dict, gathered on save and sliced on load, so it can be saved from N ranks and
loaded on M (or into the one-process model).
"""

from __future__ import annotations

import copy
import os

import torch
import torch.distributed as dist
from torch import Tensor, nn

from distcourse.comm.agree import Group, agree, members
from distcourse.parallel.replicas import differing
from distcourse.parallel.tensor.blocks import (
    ParallelMLP,
    ParallelSelfAttention,
    SequenceParallelLayerNorm,
    SequenceParallelPositions,
)
from distcourse.parallel.tensor.layers import ColumnParallelLinear, RowParallelLinear
from distcourse.parallel.tensor.vocab import VocabParallelEmbedding

SHARDED = (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding)


def parallelize_block(
    block: nn.Module,
    group: Group = None,
    *,
    sequence_parallel: bool = False,
    check: bool = True,
) -> nn.Module:
    """A copy of a pre-norm block (`ln1`, `attn`, `ln2`, `mlp`) split across `group`.

    The block's own forward, x + attn(ln1(x)) then x + mlp(ln2(x)), runs unchanged:
    on the whole sequence, or on this rank's part of it with sequence_parallel.
    """
    options = dict(sequence_parallel=sequence_parallel, check=check)
    attn = ParallelSelfAttention.from_module(block.attn, group, **options)
    mlp = ParallelMLP.from_module(block.mlp, group, **options)
    out = copy.deepcopy(block)
    out.attn, out.mlp = attn, mlp
    if sequence_parallel:
        out.ln1 = SequenceParallelLayerNorm(block.ln1, group)
        out.ln2 = SequenceParallelLayerNorm(block.ln2, group)
    return out


def parallelize_gpt(
    model: nn.Module,
    group: Group = None,
    *,
    sequence_parallel: bool = False,
    check: bool = True,
) -> nn.Module:
    """A tensor-parallel copy of a TinyGPT; `model` itself is left as it was.

    The token embedding is vocabulary-parallel, each block as in parallelize_block,
    the head column-parallel with the logits left split (B, T, vocab / N). With
    `check`, the ranks first confirm they hold the same model (one all-reduce of
    its parameters' min and max): slices of different models would train nonsense.
    """
    tp = members(group, "parallelize_gpt")
    named = list(model.named_parameters())
    if check and tp.size > 1:
        flat = torch.cat([p.detach().reshape(-1) for _, p in named])
        agree("parallelize_gpt", flat, group)  # same sizes first: no hang below
        if names := differing(named, group):
            raise ValueError(
                f"parallelize_gpt: parameter {names[0]!r} differs across ranks; "
                "seed every rank alike before building the model"
            )
    options = dict(sequence_parallel=sequence_parallel, check=check)
    out = copy.deepcopy(model)
    out.tok = VocabParallelEmbedding.from_embedding(model.tok, group, **options)
    out.blocks = nn.ModuleList(
        parallelize_block(b, group, **options) for b in model.blocks
    )
    out.head = ColumnParallelLinear.from_linear(model.head, group, **options)
    if sequence_parallel:
        out.pos = SequenceParallelPositions(model.pos, group)
        out.ln_f = SequenceParallelLayerNorm(model.ln_f, group)
    return out


def full_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """The one-process state dict of a tensor-parallel model, on every rank.

    Sharded layers gather their pieces (a collective: every rank calls this, and
    the layers are visited in the same order on all ranks); the rest is copied.
    """
    state: dict[str, Tensor] = {}
    for name, module in _owners(model):
        prefix = f"{name}." if name else ""
        if isinstance(module, SHARDED):
            own = module.full_state_dict()
        else:
            own = module.state_dict(keep_vars=False)
            own = {k: v.detach().clone() for k, v in own.items() if "." not in k}
        state.update({prefix + k: v for k, v in own.items()})
    return state


def load_full_state_dict(model: nn.Module, state: dict[str, Tensor]) -> None:
    """Load a one-process state dict: sharded layers keep their slice. No messages.

    Every key and shape is checked before anything is copied: a checkpoint of
    another model (or another size) is a ValueError naming the first difference.
    """
    shapes = _full_shapes(model)
    missing, extra = sorted(set(shapes) - set(state)), sorted(set(state) - set(shapes))
    if missing or extra:
        raise ValueError(
            f"checkpoint does not fit this model: missing {missing[:3]}, "
            f"unexpected {extra[:3]}"
        )
    for key, shape in shapes.items():
        if tuple(state[key].shape) != shape:
            raise ValueError(
                f"checkpoint does not fit this model: {key!r} has shape "
                f"{list(state[key].shape)} in the checkpoint, {list(shape)} in the "
                "model"
            )
    for name, module in _owners(model):
        prefix = f"{name}." if name else ""
        own = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
        if isinstance(module, SHARDED):
            module.load_full_state_dict(own)
        else:
            mine = {k: v for k, v in own.items() if "." not in k}
            module.load_state_dict(mine, strict=False)


def save_checkpoint(
    model: nn.Module, path: str | os.PathLike, group: Group = None
) -> None:
    """Gather the full state dict; rank 0 of `group` writes it; all wait for it."""
    state = full_state_dict(model)
    tp = members(group, "save_checkpoint")
    if tp.rank == 0:
        torch.save(state, path)
    dist.barrier(group=tp.group)


def load_checkpoint(model: nn.Module, path: str | os.PathLike) -> None:
    """Load a checkpoint saved by save_checkpoint (from any number of ranks).

    The file is read on the host (it may hold tensors of rank 0's GPU): each layer
    copies only its slice to the device its parameters are on."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    load_full_state_dict(model, state)


def _owners(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Every module with its name; sharded layers have no children of their own."""
    return list(model.named_modules())


def _full_shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """Every key of the one-process state dict, with its full shape."""
    shapes: dict[str, tuple[int, ...]] = {}
    for name, module in _owners(model):
        prefix = f"{name}." if name else ""
        if isinstance(module, ColumnParallelLinear | RowParallelLinear):
            shapes[prefix + "weight"] = (module.out_features, module.in_features)
            if module.bias is not None:
                shapes[prefix + "bias"] = (module.out_features,)
        elif isinstance(module, VocabParallelEmbedding):
            shapes[prefix + "weight"] = (module.num_embeddings, module.embedding_dim)
        else:
            for key, value in module.state_dict().items():
                if "." not in key:
                    shapes[prefix + key] = tuple(value.shape)
    return shapes
