"""Transformer pieces split across ranks: MLP, attention, sequence-parallel norms.

Both sub-layers of a block have Megatron's shape: a ColumnParallelLinear in, a local
nonlinearity (GELU; or attention over this rank's heads), a RowParallelLinear out.
So each costs one all_reduce of B x T x C in forward (g) and one in backward (f).
With sequence parallelism those become an all_gather and a reduce_scatter each, and
the layer norms between them see only this rank's tokens; a replicated parameter
used on this rank's tokens (a norm's weight, the positions) then goes through
copy_to_group (f): its gradient is the sum over ranks.
Every class is built from the one-process module (`from_module`), taking this rank's
slice, so a converted model computes what the original computes.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from distcourse.comm.agree import Group, members
from distcourse.comm.autograd import split_sizes
from distcourse.parallel.tensor import edges
from distcourse.parallel.tensor.layers import ColumnParallelLinear, RowParallelLinear


def _pair(
    first: nn.Linear,
    second: nn.Linear,
    group: Group,
    sequence_parallel: bool,
    check: bool,
) -> tuple[ColumnParallelLinear, RowParallelLinear]:
    """A column layer from `first` and a row layer from `second`: the pair decides
    once, the column layer checking its input; the row layer's input is the column
    layer's output, the same shape on every rank by construction."""
    col = ColumnParallelLinear.from_linear(
        first, group, sequence_parallel=sequence_parallel, check=check
    )
    row = RowParallelLinear.from_linear(
        second, group, sequence_parallel=sequence_parallel, check=False
    )
    return col, row


def _dropout(module: nn.Module) -> float:
    """The probability of `module`'s `drop` (an nn.Dropout), or 0.0 without one."""
    drop = getattr(module, "drop", None)
    return drop.p if isinstance(drop, nn.Dropout) else 0.0


class ParallelMLP(nn.Module):
    """fc (column) -> GELU -> proj (row) -> dropout: hidden units split across ranks.

    Input and output: (B, T, C) replicated, or (B, T / N, C) with sequence_parallel.
    """

    def __init__(
        self, fc: ColumnParallelLinear, proj: RowParallelLinear, dropout: float = 0.0
    ) -> None:
        super().__init__()
        self.fc, self.proj, self.drop = fc, proj, nn.Dropout(dropout)

    @classmethod
    def from_module(
        cls,
        mlp: nn.Module,
        group: Group = None,
        *,
        sequence_parallel: bool = False,
        check: bool = True,
    ) -> ParallelMLP:
        """Split an MLP with Linear attributes `fc`, `proj` (and `drop`): the first's
        output features and the second's input features across the ranks."""
        fc, proj = _pair(mlp.fc, mlp.proj, group, sequence_parallel, check)
        return cls(fc, proj, _dropout(mlp))

    def forward(self, x: Tensor) -> Tensor:
        return self.drop(self.proj(F.gelu(self.fc(x))))  # (B, T, 4C / N) inside


class ParallelSelfAttention(nn.Module):
    """Causal self-attention with the heads split across ranks: n_head / N each.

    query, key and value are column-parallel (this rank's heads), proj row-parallel.
    The input enters the region once, through query's `enter` (one f, not three).
    """

    def __init__(
        self,
        query: ColumnParallelLinear,
        key: ColumnParallelLinear,
        value: ColumnParallelLinear,
        proj: RowParallelLinear,
        head_dim: int,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.query, self.key, self.value, self.proj = query, key, value, proj
        self.head_dim, self.drop = head_dim, nn.Dropout(dropout)
        self.n_head = query.weight.shape[0] // head_dim  # on this rank

    @classmethod
    def from_module(
        cls,
        attn: nn.Module,
        group: Group = None,
        *,
        sequence_parallel: bool = False,
        check: bool = True,
    ) -> ParallelSelfAttention:
        """Split an attention with Linear `query`, `key`, `value`, `proj` and ints
        `n_head`, `head_dim`: whole heads to each rank, or a ValueError."""
        tp = members(group, "ParallelSelfAttention")
        if attn.n_head % tp.size:
            raise ValueError(
                f"n_head={attn.n_head} is not divisible by "
                f"tensor-parallel size {tp.size}"
            )
        query, proj = _pair(attn.query, attn.proj, group, sequence_parallel, check)
        options = dict(sequence_parallel=sequence_parallel, check=check)
        key, value = (
            ColumnParallelLinear.from_linear(lin, group, **options)
            for lin in (attn.key, attn.value)
        )
        return cls(query, key, value, proj, attn.head_dim, _dropout(attn))

    def forward(self, x: Tensor) -> Tensor:
        x = self.query.enter(x)  # f, or the sequence all-gathered: (B, T, C)
        B, T, _ = x.shape
        q, k, v = (
            lin.local(x).view(B, T, -1, self.head_dim).transpose(1, 2)
            for lin in (self.query, self.key, self.value)
        )  # (B, n_head / N, T, head_dim) each
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).reshape(B, T, -1)  # (B, T, C / N): my heads
        return self.drop(self.proj(y))


class SequenceParallelLayerNorm(nn.LayerNorm):
    """A LayerNorm on this rank's tokens, whose weight and bias enter through f.

    Every rank holds the same weight but applies it to different tokens, so the
    gradient of the whole-sequence loss is the sum of the ranks' gradients:
    copy_to_group's backward. Same parameters and state-dict keys as nn.LayerNorm.
    """

    def __init__(self, norm: nn.LayerNorm, group: Group = None) -> None:
        super().__init__(
            norm.normalized_shape,
            norm.eps,
            norm.elementwise_affine,
            norm.bias is not None,
            dtype=norm.weight.dtype,
            device=norm.weight.device,
        )
        self.load_state_dict(norm.state_dict())
        self.group = members(group, "SequenceParallelLayerNorm").group

    def forward(self, x: Tensor) -> Tensor:
        w, b = self.weight, self.bias
        w = None if w is None else edges.f(w, self.group)
        b = None if b is None else edges.f(b, self.group)
        return F.layer_norm(x, self.normalized_shape, w, b, self.eps)


class SequenceParallelPositions(nn.Embedding):
    """Learned positions for this rank's part of the sequence (tensor_split sizes,
    as reduce_scatter_along cuts it). The table is replicated and enters through f."""

    def __init__(self, embedding: nn.Embedding, group: Group = None) -> None:
        n, dim = embedding.weight.shape
        super().__init__(
            n, dim, dtype=embedding.weight.dtype, device=embedding.weight.device
        )
        self.load_state_dict(embedding.state_dict())
        self.tp = members(group, "SequenceParallelPositions")

    def forward(self, positions: Tensor) -> Tensor:
        """positions: (T,) for the whole sequence -> (T_r, C) for this rank's part."""
        sizes = split_sizes(positions.shape[0], self.tp.size)
        mine = positions.split(sizes)[self.tp.rank]
        return F.embedding(mine, edges.f(self.weight, self.tp.group))
