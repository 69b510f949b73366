"""Negative control for chapter 3b's set_epoch verdict (issue 31 item 3).

The chapter printed `no set_epoch: same order again: True`, a deterministic sampler
compared with itself, which cannot differ. It now compares epoch 1's order, after
`set_epoch(1)`, with epoch 0's; here the same check runs on a loop that forgot
`set_epoch`, and prints False.
"""

from __future__ import annotations

import pytest
from torch.utils.data import DistributedSampler

from distcourse.examples import datasets


def _changed_line(set_epoch: bool) -> str:
    """The chapter's cell: epoch 0's first indices against epoch 1's."""
    data = datasets.digits(train=True)
    sampler = DistributedSampler(data, num_replicas=2, rank=0, seed=0)
    epoch_0 = list(sampler)[:6]
    if set_epoch:
        sampler.set_epoch(1)
    epoch_1 = list(sampler)[:6]
    return f"set_epoch(1) changed the order: {epoch_1 != epoch_0}"


@pytest.mark.controls(
    "03b_ddp_in_practice",
    r"set_epoch\(1\) changed the order",
    fault="set_epoch(1) forgotten before epoch 1",
)
def test_a_forgotten_set_epoch_fails() -> None:
    assert _changed_line(set_epoch=False).endswith(": False")
    assert _changed_line(set_epoch=True).endswith(": True")
