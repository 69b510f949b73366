"""OneFlow's quick start: a 20x10 batch split over 2 ranks equals one process."""

from __future__ import annotations

import torch
from torch.nn.parallel import DistributedDataParallel

from distcourse import runtime
from distcourse.examples import models, train
from distcourse.examples.datasets import synthetic_regression
from distcourse.launch import spawn
from distcourse.parallel.ddp import DDP

ATOL = 1e-6  # ranks sum gradients in another order than one process


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return models.toy_mlp()


def _on_rank(wrap: type) -> tuple[list[float], list[torch.Tensor]]:
    info = runtime.require_initialized()
    x, y = synthetic_regression(20)
    model = _model()
    rows = slice(10 * info.rank, 10 * info.rank + 10)  # this rank's half
    losses = train.sgd_steps(wrap(model), x[rows], y[rows])
    return losses, [p.detach() for p in model.parameters()]


def _both() -> dict:
    return {"ours": _on_rank(DDP), "torch": _on_rank(DistributedDataParallel)}


def test_two_ranks_equal_one_process_on_the_whole_batch() -> None:
    model = _model()
    full = train.sgd_steps(model, *synthetic_regression(20))
    assert len(full) == 20 and full[-1] < full[0]
    ranks = spawn(_both, 2)
    for impl in ("ours", "torch"):
        mean = [(a + b) / 2 for a, b in zip(*(r[impl][0] for r in ranks), strict=True)]
        assert max(abs(a - b) for a, b in zip(mean, full, strict=True)) <= ATOL
        for p, q in zip(ranks[0][impl][1], model.parameters(), strict=True):
            assert torch.allclose(p, q, rtol=0, atol=ATOL)
