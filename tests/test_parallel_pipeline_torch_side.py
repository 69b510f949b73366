"""torch.distributed.pipelining on gloo gives our losses and gradients, schedule by
schedule; run under a finite timeout and a deadline, since it has hung on gloo."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from distcourse.launch import spawn
from distcourse.parallel import pipeline as pp
from distcourse.parallel.pipeline.torch_side import TorchPipeline

TOL = 1e-6


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(8)])


def _ours_and_torchs(m: int) -> dict[str, tuple]:
    """Per schedule: (|loss difference| or None, largest gradient difference)."""
    p = dist.get_world_size()
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 8, generator=gen), torch.randn(8, 8, generator=gen)
    ours = {"GPipe": pp.gpipe(p, m), "1F1B": pp.one_f_one_b(p, m),
            "interleaved 1F1B": pp.interleaved(p, m, 2)}  # fmt: skip
    out = {}
    for name, schedule in ours.items():
        a, b = (pp.split_by_count(_model(), schedule.stages) for _ in range(2))
        mine = pp.Pipeline(a, schedule, F.mse_loss, timeout=10)
        theirs = TorchPipeline(b, name, m, F.mse_loss)
        la, lb = mine.step(x, y), theirs.step(x, y)
        mine.close()
        pairs = [
            (p1, p2)
            for s in mine.local
            for p1, p2 in zip(a[s].parameters(), b[s].parameters(), strict=True)
        ]
        diff = max((p1.grad - p2.grad).abs().max().item() for p1, p2 in pairs)
        out[name] = (None if la is None else abs(la.item() - lb.item()), diff)
    return out


def test_torch_pipelining_gives_our_losses_and_gradients_on_gloo() -> None:
    results = spawn(_ours_and_torchs, 2, 4, timeout=20, deadline=150)
    for name in ("GPipe", "1F1B", "interleaved 1F1B"):
        assert results[0][name][0] is None and results[1][name][0] <= TOL, name
        assert max(r[name][1] for r in results) <= TOL, name


ZERO_BUBBLE = ("interleaved zero bubble", "ZBV zero bubble", "DualPipeV")


def _zero_bubble(m: int) -> dict[str, tuple]:
    """torch's zero-bubble family (no twin of ours but ZB-H1) against one process:
    per schedule, (this rank's stages, |loss difference| or None, largest gradient
    difference)."""
    p = dist.get_world_size()
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 8, generator=gen), torch.randn(8, 8, generator=gen)
    alone = _model()
    want = F.mse_loss(alone(x), y)
    want.backward()
    ref = pp.split_by_count(alone, 2 * p)
    out = {}
    for name in ZERO_BUBBLE:
        stages = pp.split_by_count(_model(), 2 * p)
        theirs = TorchPipeline(stages, name, m, F.mse_loss)
        loss = theirs.step(x, y)
        diff = max((a.grad - b.grad).abs().max().item()
                   for s in theirs.mine
                   for a, b in zip(stages[s].parameters(), ref[s].parameters(),
                                   strict=True))  # fmt: skip
        out[name] = (theirs.mine, None if loss is None else abs(loss - want).item(),
                     diff)  # fmt: skip
    with pytest.raises(ValueError) as err:  # a V needs 2 stages per rank
        TorchPipeline(pp.split_by_count(_model(), 3), "DualPipeV", m, F.mse_loss)
    out["refused"] = str(err.value)
    return out


def test_torch_zero_bubble_schedules_equal_one_process_on_gloo() -> None:
    results = spawn(_zero_bubble, 2, 4, timeout=20, deadline=150)
    assert results[0]["ZBV zero bubble"][0] == [0, 3]  # the V: first and last stage
    assert results[1]["DualPipeV"][0] == [1, 2]
    assert results[0]["interleaved zero bubble"][0] == [0, 2]
    assert results[0]["refused"] == ("DualPipeV runs two stages per rank (a V): 3 "
                                     "stages, 2 ranks")  # fmt: skip
    for name in ZERO_BUBBLE:
        losses = [r[name][1] for r in results if r[name][1] is not None]
        assert len(losses) == 1 and losses[0] <= TOL, name
        assert max(r[name][2] for r in results) <= TOL, name


def test_torch_placements_are_checked_before_any_stage() -> None:
    with pytest.raises(ValueError, match="unknown schedule"):
        TorchPipeline([nn.Linear(2, 2)], "ZB-H1", 4, F.mse_loss)
