"""Placements are cached by ranks and timeout: the same call gives the same groups,
another timeout gives other groups, and they keep that timeout."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

import distcourse.global_tensor as gt
from distcourse.launch import spawn


def _cached() -> dict:
    a = gt.placement("cpu", ranks=[[0, 1], [2, 3]], timeout=30)
    b = gt.placement("cpu", ranks=[[0, 1], [2, 3]], timeout=30)
    c = gt.placement("cpu", ranks=[[0, 1], [2, 3]], timeout=1)
    out = dict(same=a is b, other=c is not a and c.groups[0] is not a.groups[0])
    if dist.get_rank() == 0:  # rank 2, its partner on mesh dimension 0, never comes
        start = time.monotonic()
        try:
            dist.all_reduce(torch.ones(1), group=c.groups[0])
        except RuntimeError:
            out["waited"] = time.monotonic() - start
    else:  # alive, so that rank 0 waits for its timeout, not for a closed socket
        time.sleep(4)
    return out


def test_equal_placements_are_built_once_and_a_new_timeout_builds_anew() -> None:
    results = spawn(_cached, 4, timeout=30)
    assert all(got["same"] and got["other"] for got in results)
    assert 0.8 < results[0]["waited"] < 3.5  # the second placement's 1 s, not 30 s
