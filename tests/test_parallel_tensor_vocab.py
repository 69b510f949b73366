"""The vocabulary split across ranks: the embedding and the cross-entropy equal one
process (values and gradients), and torch's RowwiseParallel embedding and
loss_parallel; the logits never move: the loss's messages are 3 numbers per token.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from helpers import torch_parallelized
from spawned import assert_within, error_of, max_diff
from torch import nn

from distcourse.comm.ledger import Ledger
from distcourse.launch import spawn
from distcourse.parallel.tensor import (
    ColumnParallelLinear,
    VocabParallelEmbedding,
    vocab_parallel_cross_entropy,
)

TOL = 1e-5
B, T, C, V = 3, 5, 8, 24


def _one_process_equal() -> dict[str, float]:
    n, r = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(0)
    emb, head = nn.Embedding(V, C), nn.Linear(C, V, bias=False)
    ids, target = torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T))
    ids[0, :2] = torch.tensor([0, V - 1])  # the first and last rows, owned by 0, n-1
    # shifted by 1000: a naive softmax overflows; the max makes it stable
    logits = head(emb(ids)) + 1000.0
    loss = F.cross_entropy(logits.flatten(0, 1), target.flatten())
    loss.backward()
    pemb = VocabParallelEmbedding.from_embedding(emb)
    phead = ColumnParallelLinear.from_linear(head)
    with Ledger() as ledger:
        plogits = phead(pemb(ids)) + 1000.0  # (B, T, V / n): never gathered
        ploss = vocab_parallel_cross_entropy(plogits, target)
    ploss.backward()
    reduces = [rec.bytes for rec in ledger.records if rec.op == "all_reduce"]
    # embedding: one all_reduce of B T C floats; loss: B T (max), then 2 B T
    assert reduces == [B * T * C * 4, B * T * 4, 2 * B * T * 4], reduces
    return {
        "loss": abs(ploss.item() - loss.item()),
        "embedding grad": max_diff(pemb.weight.grad, emb.weight.grad.chunk(n, 0)[r]),
        "head grad": max_diff(phead.weight.grad, head.weight.grad.chunk(n, 0)[r]),
        "per-token loss": max_diff(
            vocab_parallel_cross_entropy(plogits, target, reduction="none"),
            F.cross_entropy(
                logits.flatten(0, 1), target.flatten(), reduction="none"
            ).view(B, T),
        ),
    }


@pytest.mark.parametrize("world_size", [2, 4])
def test_embedding_and_cross_entropy_equal_one_process(world_size: int) -> None:
    assert_within(_one_process_equal, world_size, tol=TOL)


def _against_torch() -> dict[str, float]:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        loss_parallel,
    )

    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(V, C), nn.Linear(C, V, bias=False))
    ids, target = torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T))
    plan = {
        "0": RowwiseParallel(input_layouts=Replicate()),  # vocabulary-parallel
        "1": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False),
    }
    theirs = torch_parallelized(model, plan)
    with loss_parallel():  # cross-entropy on the class-sharded logits DTensor
        loss_theirs = F.cross_entropy(theirs(ids).flatten(0, 1), target.flatten())
        loss_theirs.backward()
    emb = VocabParallelEmbedding.from_embedding(model[0])
    head = ColumnParallelLinear.from_linear(model[1])
    loss = vocab_parallel_cross_entropy(head(emb(ids)), target)
    loss.backward()
    # torch 2.14 hands the sharded table a Replicate gradient: compare my rows of it
    n, r = dist.get_world_size(), dist.get_rank()
    their_rows = theirs[0].weight.grad.full_tensor().chunk(n, 0)[r]
    return {
        "loss": abs(loss.item() - loss_theirs.full_tensor().item()),
        "embedding grad": max_diff(emb.weight.grad, their_rows),
        "head grad": max_diff(head.weight.grad, theirs[1].weight.grad.to_local()),
    }


def test_equal_to_torch_rowwise_embedding_and_loss_parallel() -> None:
    assert_within(_against_torch, 2, tol=TOL)


def _bad_input() -> list[str]:
    r = dist.get_rank()
    emb = VocabParallelEmbedding(V, C)
    logits = torch.randn(B, T, V // dist.get_world_size())
    cases = [
        lambda: VocabParallelEmbedding(V + 1, C),
        lambda: emb(torch.tensor([[0, V]])),  # a token that does not exist
        lambda: emb(torch.zeros(2, 3 + r, dtype=torch.long)),  # shapes differ
        lambda: vocab_parallel_cross_entropy(logits, torch.zeros(B, T + 1).long()),
        lambda: vocab_parallel_cross_entropy(logits, torch.full((B, T), V)),
    ]
    return [error_of(case) for case in cases]


def test_bad_input_is_an_error_on_every_rank() -> None:
    wants = [
        f"num_embeddings={V + 1} is not divisible by tensor-parallel size 2",
        f"token ids must lie in [0, {V}), got [0, {V}]",
        "ranks disagree on shape",
        f"target of shape [{B}, {T + 1}] does not fit logits",
        f"token ids must lie in [0, {V}), got [{V}, {V}]",
    ]
    for errors in spawn(_bad_input, 2, timeout=5, deadline=30):
        for want, got in zip(wants, errors, strict=True):
            assert want in got, (want, got)
