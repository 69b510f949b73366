"""gt.save / gt.load round trip on real ranks: a model-parallel state_dict written
whole by rank 0 and read back by rank 0 into fresh split and broadcast models."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

import distcourse.global_tensor as gt
from distcourse.launch import spawn


def _round_trip(path: str) -> list[bool]:
    p = gt.placement("cpu", ranks=[0, 1])
    torch.manual_seed(dist.get_rank())
    model = gt.to_global(nn.Linear(4, 3), p, gt.sbp.split(0))  # 6 logical rows
    want = {k: v.full_tensor() for k, v in model.state_dict().items()}
    gt.save(model.state_dict(), path, global_dst_rank=0)
    dist.barrier()
    state = gt.load(path, global_src_rank=0)
    fresh = gt.to_global(nn.Linear(4, 3), p, gt.sbp.split(0))
    fresh.load_state_dict(state)
    wide = gt.to_global(nn.Linear(4, 6), p, gt.sbp.broadcast)
    wide.load_state_dict(state)
    return [
        all(torch.equal(state[k].full_tensor(), want[k]) for k in want),
        all(
            torch.equal(v.full_tensor(), want[k]) for k, v in fresh.state_dict().items()
        ),
        fresh.weight.sbp == (gt.sbp.split(0),),
        all(
            torch.equal(v.full_tensor(), want[k]) for k, v in wide.state_dict().items()
        ),
        Path(path).exists() and set(torch.load(path)) == {"weight", "bias"},
    ]


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    path = str(tmp_path / "model.pt")
    assert spawn(_round_trip, 2, path, timeout=20) == [[True] * 5] * 2


def _bad_ranks() -> list[str]:
    got = []
    for fn in (
        lambda: gt.save({}, "x.pt", global_dst_rank=2),
        lambda: gt.load("x.pt", global_src_rank=-1),
    ):
        try:
            fn()
        except ValueError as err:
            got.append(str(err))
    return got


def test_save_and_load_refuse_a_rank_outside_the_world() -> None:
    for got in spawn(_bad_ranks, 2, timeout=10):
        assert got[0].startswith("global_dst_rank must be a rank of this world")
        assert got[1].startswith("global_src_rank must be a rank of this world")
