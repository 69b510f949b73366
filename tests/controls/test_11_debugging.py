"""Negative controls of chapter 11: each lab's check, as the chapter's cell runs it
on the reference fix (distcourse/labs/solutions.py), run with that fix replaced by a
plausible wrong one, must say FAIL. The cells that bind `lab` also run the broken
program (minutes of timeouts in all): the control binds it directly (a Code line).
Each check starts its own ranks (tests/controls/harness.py).
"""

from __future__ import annotations

import harness
import torch
import torch.distributed as dist
from harness import Code, Fault, Plant
from torch import Tensor, nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from distcourse.labs import solutions

CHAPTER = harness.Chapter(
    "11_debugging",
    setup=["from distcourse.labs import solutions"],
    ranks=0,
    stored=True,
)


def summed_loss(loss: Tensor, rank: int, world: int) -> float:
    """The loss all-reduced on every rank, but never divided by the world."""
    dist.all_reduce(loss)
    return loss.item()


def sorted_but_summed(grads: dict[str, Tensor], world: int) -> None:
    """Gradients all-reduced in a shared order, summed, not averaged."""
    for name in sorted(grads):
        dist.all_reduce(grads[name])


def warmup_capped_by_max(stage: int, stages: int, micro_batches: int) -> int:
    """The warm-up capped with max instead of min."""
    return max(stages - stage - 1, micro_batches)


def never_cut_back(preds: Tensor, world: int) -> Tensor:
    """Pieces padded to the largest, gathered, never cut back."""
    padded = torch.zeros(3, 1)
    padded[: preds.shape[0]] = preds
    pieces = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(pieces, padded)
    return torch.cat(pieces)


def seed_still_differs(seed: int, tp_rank: int, tp_size: int) -> int:
    """A dropout seed still different on each tensor-parallel rank."""
    return seed * (tp_rank + 1)


def averaged_norm_grads(norm: nn.LayerNorm, world: int) -> None:
    """The sequence-parallel norm's gradients averaged over ranks, not summed."""
    for p in norm.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world


def rank_0s_share(dataset: TensorDataset, rank: int, world: int) -> DataLoader:
    """A DistributedSampler that gives every rank rank 0's share."""
    sampler = DistributedSampler(dataset, num_replicas=world, rank=0)
    return DataLoader(dataset, batch_size=4, sampler=sampler)


def unwrapped(model: nn.Module) -> nn.Module:
    """The model left unwrapped: no DDP, gradients never averaged."""
    return model


WRONG = {  # lab: (the reference fix the chapter checks, a wrong one in its place)
    "SKIPPED_COLLECTIVE": ("log_loss", summed_loss),
    "COLLECTIVE_ORDER": ("sync_grads", sorted_but_summed),
    "PIPELINE_MICROBATCHES": ("warmup", warmup_capped_by_max),
    "UNEVEN_GATHER": ("gather", never_cut_back),
    "DROPOUT_SEED": ("dropout_seed", seed_still_differs),
    "LAYERNORM_SP": ("sync_norm_grads", averaged_norm_grads),
    "SAMPLER": ("make_loader", rank_0s_share),
    "UNUSED_PARAMETERS": ("wrap", unwrapped),
}
FAULTS = {
    name: Fault(
        [Code(f"lab = labs.{name}"), f"print(lab.check(solutions.{fix}))"],
        Plant(solutions, fix, wrong),
    )
    for name, (fix, wrong) in WRONG.items()
}


CONTROLS = harness.Controls(
    "11_debugging",
    test_a_summed_loss_fails=harness.Flip(
        ["SKIPPED_COLLECTIVE"],
        r"skipped_collective: your fix on \d ranks against one process",
        "the loss all-reduced on every rank but not divided by world",
    ),
    test_sorted_but_summed_gradients_fail=harness.Flip(
        ["COLLECTIVE_ORDER"],
        r"collective_order: your fix on \d ranks against one process",
        "gradients all-reduced in a shared order but summed, not averaged",
    ),
    test_a_warmup_capped_the_wrong_way_fails=harness.Flip(
        ["PIPELINE_MICROBATCHES"],
        r"pipeline_microbatches: your fix on \d ranks against one process",
        "the warm-up capped with max instead of min",
    ),
    test_padded_pieces_not_cut_back_fail=harness.Flip(
        ["UNEVEN_GATHER"],
        r"uneven_gather: your fix on \d ranks against one process",
        "pieces padded to the largest but never cut back",
    ),
    test_a_seed_that_still_differs_fails=harness.Flip(
        ["DROPOUT_SEED"],
        r"dropout_seed: your fix on \d ranks against one process",
        "a seed still different on each tensor-parallel rank",
    ),
    test_averaged_norm_gradients_fail=harness.Flip(
        ["LAYERNORM_SP"],
        r"layernorm_sp: your fix on \d ranks against one process",
        "the norm's gradients averaged over ranks instead of summed",
    ),
    test_every_rank_given_rank_0s_share_fails=harness.Flip(
        ["SAMPLER"],
        r"sampler: your fix on \d ranks against one process",
        "a DistributedSampler that gives every rank rank 0's share",
    ),
    test_an_unwrapped_model_fails=harness.Flip(
        ["UNUSED_PARAMETERS"],
        r"unused_parameters: your fix on \d ranks against one process",
        "the model left unwrapped: no DDP, gradients never averaged",
    ),
)
globals().update(CONTROLS.tests())
