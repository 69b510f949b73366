"""torch.distributed.pipelining on gloo gives our losses and gradients, schedule by
schedule; run under a finite timeout and a deadline, since it has hung on gloo."""

from __future__ import annotations

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
