"""Negative controls of chapter 11: each lab's check, run on a wrong fix, says FAIL.

The chapter prints `<lab>: your fix on N ranks against one process: PASS` for the
reference fixes (distcourse/labs/solutions.py). Here each check gets a plausible
wrong fix instead, and must say FAIL, with the lab's hint.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from distcourse.labs import LABS

TIMEOUT = 2.0


def _assert_fails(name: str, fix: object) -> None:
    verdict = LABS[name].check(fix, timeout=TIMEOUT)
    text = str(verdict)
    assert not verdict.passed, text
    assert text.splitlines()[0].endswith("against one process: FAIL"), text
    assert text.splitlines()[-1] == f"hint: {LABS[name].hint}", text


@pytest.mark.controls(
    "11_debugging",
    r"skipped_collective: your fix on \d ranks against one process",
    fault="the loss all-reduced on every rank but not divided by world",
)
def test_a_summed_loss_fails() -> None:
    def log_loss(loss: Tensor, rank: int, world: int) -> float:
        dist.all_reduce(loss)
        return loss.item()

    _assert_fails("skipped_collective", log_loss)


@pytest.mark.controls(
    "11_debugging",
    r"collective_order: your fix on \d ranks against one process",
    fault="gradients all-reduced in a shared order but summed, not averaged",
)
def test_sorted_but_summed_gradients_fail() -> None:
    def sync_grads(grads: dict[str, Tensor], world: int) -> None:
        for name in sorted(grads):
            dist.all_reduce(grads[name])

    _assert_fails("collective_order", sync_grads)


@pytest.mark.controls(
    "11_debugging",
    r"pipeline_microbatches: your fix on \d ranks against one process",
    fault="the warm-up capped with max instead of min",
)
def test_a_warmup_capped_the_wrong_way_fails() -> None:
    def warmup(stage: int, stages: int, micro_batches: int) -> int:
        return max(stages - stage - 1, micro_batches)

    _assert_fails("pipeline_microbatches", warmup)


@pytest.mark.controls(
    "11_debugging",
    r"uneven_gather: your fix on \d ranks against one process",
    fault="pieces padded to the largest but never cut back",
)
def test_padded_pieces_not_cut_back_fail() -> None:
    def gather(preds: Tensor, world: int) -> Tensor:
        padded = torch.zeros(3, 1)
        padded[: preds.shape[0]] = preds
        pieces = [torch.empty_like(padded) for _ in range(world)]
        dist.all_gather(pieces, padded)
        return torch.cat(pieces)

    _assert_fails("uneven_gather", gather)


@pytest.mark.controls(
    "11_debugging",
    r"dropout_seed: your fix on \d ranks against one process",
    fault="a seed still different on each tensor-parallel rank",
)
def test_a_seed_that_still_differs_fails() -> None:
    def dropout_seed(seed: int, tp_rank: int, tp_size: int) -> int:
        return seed * (tp_rank + 1)

    _assert_fails("dropout_seed", dropout_seed)


@pytest.mark.controls(
    "11_debugging",
    r"layernorm_sp: your fix on \d ranks against one process",
    fault="the norm's gradients averaged over ranks instead of summed",
)
def test_averaged_norm_gradients_fail() -> None:
    def sync_norm_grads(norm: nn.LayerNorm, world: int) -> None:
        for p in norm.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world

    _assert_fails("layernorm_sp", sync_norm_grads)


@pytest.mark.controls(
    "11_debugging",
    r"sampler: your fix on \d ranks against one process",
    fault="a DistributedSampler that gives every rank rank 0's share",
)
def test_every_rank_given_rank_0s_share_fails() -> None:
    def make_loader(dataset: TensorDataset, rank: int, world: int) -> DataLoader:
        sampler = DistributedSampler(dataset, num_replicas=world, rank=0)
        return DataLoader(dataset, batch_size=4, sampler=sampler)

    _assert_fails("sampler", make_loader)


@pytest.mark.controls(
    "11_debugging",
    r"unused_parameters: your fix on \d ranks against one process",
    fault="the model left unwrapped: no DDP, gradients never averaged",
)
def test_an_unwrapped_model_fails() -> None:
    def wrap(model: nn.Module) -> nn.Module:
        return model

    _assert_fails("unused_parameters", wrap)
