"""Negative controls for the chapter 3 overlap verdict rewritten by issue 31 (item 2).

Overlap: the chapter prints `some all-reduce completed behind backward, in at least
one of 40 steps (4 ranks x 10): True`, from `trace.hidden_fraction` of our DDP's
timeline. The measure used to count every all-reduce launched before the last
gradient, so any DDP with two buckets passed. Here the same check runs on a real DDP
that launches its one all-reduce at the last gradient, and on planted timelines of a
DDP that sends every bucket after backward and of one whose early launches sat in a
queue until backward ended: all print False.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from distcourse import runtime, trace
from distcourse.examples import models
from distcourse.launch import spawn
from distcourse.parallel.ddp import DDP


def _overlap_line(shares: list[float]) -> str:
    """The chapter's verdict line, from every step's hidden share."""
    return (
        f"some all-reduce completed behind backward, in at least one of "
        f"{len(shares)} steps (4 ranks x 10): {max(shares) > 0}"
    )


def _one_bucket_shares(steps: int = 3) -> list[float]:
    """A real DDP whose only all-reduce is launched at the last gradient."""
    runtime.seed_everything(0, per_rank=False)
    net = DDP(models.wide_mlp(width=64, depth=4, d_in=16), bucket_cap_mb=100.0)
    x, y = torch.randn(32, 16), torch.randint(0, 10, (32,))
    shares = []
    for _ in range(steps):
        net.zero_grad()
        F.cross_entropy(net(x), y).backward()
        shares.append(trace.hidden_fraction(net.timeline))
    return shares


@pytest.mark.controls(
    "03_data_parallel",
    r"some all-reduce completed behind backward, in at least one of",
    fault="a DDP that launches its all-reduces only after backward, live and planted;"
    " buckets launched early that wait in a queue until backward ends",
)
def test_a_ddp_that_sends_after_backward_fails() -> None:
    shares = [s for rank in spawn(_one_bucket_shares, 2) for s in rank]
    assert _overlap_line(shares).endswith(": False")
    after = [  # five buckets, every one launched after the last gradient
        ("forward", 0.0, 1.0),
        ("backward", 1.0, 4.0),
        *((f"all_reduce {i}", 4.0 + i, 4.5 + i) for i in range(5)),
    ]
    queued = [  # launched during backward, served only after it
        ("backward", 1.0, 4.0),
        *((f"all_reduce {i}", 1.5 + 0.5 * i, 4.2 + i) for i in range(5)),
    ]
    planted = [trace.hidden_fraction(t) for t in (after, queued)]
    assert _overlap_line(planted).endswith(": False")
    served = [("backward", 1.0, 4.0), ("all_reduce 0", 1.5, 3.0)]  # the real thing
    assert _overlap_line([trace.hidden_fraction(served)]).endswith(": True")
