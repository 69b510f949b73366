"""torch.distributed.pipelining on gloo gives our losses and gradients, schedule by
schedule; run under a finite timeout and a deadline, since it has hung on gloo."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from distcourse import torchcompat
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
    ours = {
        "GPipe": pp.gpipe(p, m),
        "1F1B": pp.one_f_one_b(p, m),
        "interleaved 1F1B": pp.interleaved(p, m, 2),
    }
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


V_SHAPED = ("ZBV zero bubble", "DualPipeV")  # refused on gloo before torch 2.14
ZERO_BUBBLE = ("interleaved zero bubble",) + (
    V_SHAPED if torchcompat.V_SCHEDULES_ON_GLOO else ()
)


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
        diff = max(
            (a.grad - b.grad).abs().max().item()
            for s in theirs.mine
            for a, b in zip(stages[s].parameters(), ref[s].parameters(), strict=True)
        )
        out[name] = (
            theirs.mine,
            None if loss is None else abs(loss - want).item(),
            diff,
        )
    with pytest.raises(ValueError) as err:  # a V needs 2 stages per rank
        TorchPipeline(pp.split_by_count(_model(), 3), "DualPipeV", m, F.mse_loss)
    out["refused"] = str(err.value)
    return out


def test_torch_zero_bubble_schedules_equal_one_process_on_gloo() -> None:
    results = spawn(_zero_bubble, 2, 4, timeout=20, deadline=150)
    if torchcompat.V_SCHEDULES_ON_GLOO:  # the V: first and last stage on rank 0
        assert results[0]["ZBV zero bubble"][0] == [0, 3]
        assert results[1]["DualPipeV"][0] == [1, 2]
    assert results[0]["interleaved zero bubble"][0] == [0, 2]
    assert results[0]["refused"] == (
        "DualPipeV runs two stages per rank (a V): 3 stages, 2 ranks"
    )
    for name in ZERO_BUBBLE:
        losses = [r[name][1] for r in results if r[name][1] is not None]
        assert len(losses) == 1 and losses[0] <= TOL, name
        assert max(r[name][2] for r in results) <= TOL, name


def _v_refused() -> list[str]:
    """The refusal of each V schedule on gloo, before any stage is built."""
    out = []
    for name in V_SHAPED:
        with pytest.raises(NotImplementedError) as err:
            TorchPipeline(pp.split_by_count(_model(), 4), name, 4, F.mse_loss)
        out.append(str(err.value))
    return out


@pytest.mark.skipif(
    torchcompat.V_SCHEDULES_ON_GLOO,
    reason=f"torch {torchcompat.TORCH} runs the V schedules on gloo",
)
def test_v_schedules_are_refused_on_gloo_before_torch_2_14() -> None:
    """torch 2.11's ZBV and DualPipeV fail on gloo ("Pair is not connected")."""
    for message in spawn(_v_refused, 2, timeout=20)[0]:
        assert "on gloo needs torch 2.14 or newer" in message


def test_torch_placements_are_checked_before_any_stage() -> None:
    with pytest.raises(ValueError, match="unknown schedule"):
        TorchPipeline([nn.Linear(2, 2)], "ZB-H1", 4, F.mse_loss)
