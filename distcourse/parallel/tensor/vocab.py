"""The vocabulary split across ranks: the embedding's rows and the head's logits.

A language model's two largest matrices are vocab x C: the token embedding and the
output head. `VocabParallelEmbedding` gives rank r the rows of tokens
[r V/N, (r+1) V/N): it looks up the tokens it owns, writes zeros for the others, and
the sum over ranks (g) is the embedding. The head is a ColumnParallelLinear, so each
rank holds V/N logits per token, and `vocab_parallel_cross_entropy` computes the loss
from them without ever gathering the logits (B x T x V floats): it all-reduces a max
per token (for stability), then the sum of exponentials and the target's logit (one
call of 2 x B x T numbers). The softmax's gradient is local.
"""

from __future__ import annotations

from typing import Any, Unpack

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from distcourse.comm.agree import Group, Members, agree, members
from distcourse.parallel.tensor import edges
from distcourse.parallel.tensor.checkpoint import check_keys
from distcourse.parallel.tensor.layers import SplitOptions, split


def _check_ids(what: str, ids: Tensor, vocab: int) -> None:
    """ValueError unless ids are integers in [0, vocab) (a one-process layer's rule)."""
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise ValueError(f"{what}: token ids must be integers, got {ids.dtype}")
    if ids.numel() and (ids.min() < 0 or ids.max() >= vocab):
        raise ValueError(
            f"{what}: token ids must lie in [0, {vocab}), got "
            f"[{ids.min().item()}, {ids.max().item()}]"
        )


def _owned(ids: Tensor, start: int, count: int) -> tuple[Tensor, Tensor]:
    """(ids shifted to this rank's rows with 0 where not owned, mask of not owned)."""
    outside = (ids < start) | (ids >= start + count)
    return (ids - start).masked_fill(outside, 0), outside


class VocabParallelEmbedding(nn.Module):
    """nn.Embedding with rows (tokens) split across the ranks of `group`.

    Input: the same token ids (B, T) on every rank. Output: (B, T, C), replicated;
    with `sequence_parallel`, this rank's part of the sequence (reduce-scatter in
    place of the all-reduce, along `seq_dim`). `check=False` skips the shape
    agreement and the ids' range check too: reading the ids' smallest and largest
    value is a device-to-host sync on a GPU, so a caller that drops the checks
    (e.g. after checking its batch on the host) drops that sync as well.
    """

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        **options: Unpack[SplitOptions],
    ) -> None:
        super().__init__()
        rows, made = split(self, "num_embeddings", num_embeddings, options)
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.start = self.tp.rank * rows  # first token this rank owns
        self.weight = nn.Parameter(torch.randn(rows, embedding_dim, **made))

    @classmethod
    def from_embedding(
        cls, embedding: nn.Embedding, group: Group = None, **options: object
    ) -> VocabParallelEmbedding:
        """This rank's rows of `embedding`, on its device; the embedding itself is
        unchanged."""
        w = embedding.weight
        layer = cls(*w.shape, group=group, dtype=w.dtype, device=w.device, **options)
        layer.load_full_state_dict(embedding.state_dict())
        return layer

    def forward(self, ids: Tensor) -> Tensor:
        tp, name = self.tp, "VocabParallelEmbedding"

        def ids_in_vocabulary() -> int:
            if self.check:  # a host sync on a device: only where the layer checks
                _check_ids(name, ids, self.num_embeddings)
            return -1

        agree(name, ids, tp.group, validate=ids_in_vocabulary, check=self.check)
        mine, outside = _owned(ids, self.start, self.weight.shape[0])
        part = F.embedding(mine, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        if self.sequence_parallel:  # (B, T / N, C): my part of the sequence
            return edges.scatter_sequence(part, self.seq_dim, tp.group)
        return edges.g(part, tp.group)  # (B, T, C)

    def full_state_dict(self) -> dict[str, Tensor]:
        """The whole table, gathered (a collective of the group)."""
        with torch.no_grad():
            return {"weight": edges.gather(self.weight.detach(), 0, self.tp.group)}

    def load_full_state_dict(self, state: dict[str, Tensor]) -> None:
        """Keep this rank's rows of a full state dict (no messages)."""
        shape = (self.num_embeddings, self.embedding_dim)
        check_keys("VocabParallelEmbedding", state, {"weight": shape})
        with torch.no_grad():
            self.weight.copy_(state["weight"].chunk(self.tp.size, 0)[self.tp.rank])

    def to_embedding(self) -> nn.Embedding:
        """The whole table as one nn.Embedding (a collective: every rank calls it)."""
        embedding = nn.Embedding(
            self.num_embeddings,
            self.embedding_dim,
            dtype=self.weight.dtype,
            device=self.weight.device,
        )
        embedding.load_state_dict(self.full_state_dict())
        return embedding

    def extra_repr(self) -> str:
        return (
            f"{self.num_embeddings}, {self.embedding_dim} (tokens {self.start}.."
            f"{self.start + self.weight.shape[0] - 1} on this rank of "
            f"{self.tp.size}), "
            f"sequence_parallel={self.sequence_parallel}"
        )


class _CrossEntropy(torch.autograd.Function):
    """Per-token loss log(sum_j e^(z_j - m)) - (z_t - m) from vocabulary shards."""

    @staticmethod
    def forward(ctx: Any, logits: Tensor, target: Tensor, tp: Members) -> Tensor:
        top = logits.detach().amax(-1)  # (...,) my max; the global one next
        dist.all_reduce(top, op=dist.ReduceOp.MAX, group=tp.group)
        shifted = logits.detach() - top.unsqueeze(-1)  # <= 0: exp cannot overflow
        local, outside = _owned(target, tp.rank * logits.shape[-1], logits.shape[-1])
        mine = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1)
        exp = shifted.exp()
        sums = torch.stack([exp.sum(-1), mine.masked_fill(outside, 0.0)])
        dist.all_reduce(sums, group=tp.group)  # (2, ...): sum of exp, target logit
        ctx.save_for_backward(exp.div_(sums[0].unsqueeze(-1)), local, outside)
        return sums[0].log() - sums[1]  # (...,)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple:
        softmax, local, outside = ctx.saved_tensors  # d loss / d z = softmax - onehot
        onehot = F.one_hot(local, softmax.shape[-1]).to(softmax.dtype)
        onehot.masked_fill_(outside.unsqueeze(-1), 0.0)
        return (softmax - onehot) * grad.unsqueeze(-1), None, None


def vocab_parallel_cross_entropy(
    logits: Tensor,
    target: Tensor,
    group: Group = None,
    reduction: str = "mean",
    check: bool = True,
) -> Tensor:
    """F.cross_entropy(full_logits.flatten(0, -2), target.flatten()) from shards.

    `logits` (..., V / N): this rank's vocabulary slice (a ColumnParallelLinear
    head's output); `target` (...): token ids in [0, V), the same on every rank.
    Returns the mean (or "sum", or "none": per token) on every rank. Messages: one
    all_reduce (max) of the tokens' count and one of twice that; no logits move.
    `check=False` skips the agreement and the targets' range check (a host sync).
    """
    tp = members(group, "vocab_parallel_cross_entropy")
    name = "vocab_parallel_cross_entropy"

    def arguments_fit() -> int:
        if reduction not in ("mean", "sum", "none"):
            raise ValueError(
                f"{name}: reduction must be mean, sum or none, got {reduction!r}"
            )
        if logits.dim() < 1 or target.shape != logits.shape[:-1]:
            raise ValueError(
                f"{name}: target of shape {list(target.shape)} does not "
                f"fit logits of shape {list(logits.shape)}"
            )
        if check:  # a host sync on a device: only where the caller checks
            _check_ids(name, target, logits.shape[-1] * tp.size)
        return -1

    agree(name, logits, group, validate=arguments_fit, check=check)
    loss = (
        _CrossEntropy.apply(logits, target, tp)
        if tp.size > 1
        else (
            F.cross_entropy(
                logits.flatten(0, -2), target.flatten(), reduction="none"
            ).view(target.shape)
        )
    )
    if reduction == "none":
        return loss
    return loss.mean() if reduction == "mean" else loss.sum()
