"""The plain runner, on real gloo ranks, equals one process and the fast `Pipeline`:
the loss and every gradient, over two steps of plain SGD (SGD moves each parameter
by its gradient, so a wrongly scaled gradient changes the second step); bad input
is refused on every rank before any message."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from helpers import chain_batch, refused_alike, tanh_chain
from torch import nn

from distcourse.comm.ledger import Ledger
from distcourse.launch import spawn
from distcourse.parallel import pipeline as pp
from distcourse.parallel.pipeline.plain import PlainPipeline

TOL = 1e-6  # float32, batch 8: the micro-batches add in another order
MAKERS = {
    "GPipe": lambda p, m: pp.gpipe(p, m),
    "1F1B": lambda p, m: pp.one_f_one_b(p, m),
    "interleaved": lambda p, m: pp.interleaved(p, m, 2),
}


def _differences(m: int) -> dict[str, dict[str, float]]:
    """Per schedule, on this rank: the largest |loss| and |gradient| difference of
    the plain runner against one process and against the fast Pipeline, over two
    SGD steps."""
    p, (x, y) = dist.get_world_size(), chain_batch()
    out = {}
    for name, make in MAKERS.items():
        schedule = make(p, m)
        alone = tanh_chain()
        plain = pp.split_by_count(copy.deepcopy(alone), schedule.stages)
        fast = pp.split_by_count(copy.deepcopy(alone), schedule.stages)
        ref = pp.split_by_count(alone, schedule.stages)
        runners = [
            PlainPipeline(plain, schedule, F.mse_loss),
            pp.Pipeline(fast, schedule, F.mse_loss, timeout=10),
        ]
        models = [nn.Sequential(*plain), nn.Sequential(*fast), alone]
        sgd = [torch.optim.SGD(model.parameters(), lr=0.1) for model in models]
        found = {"one process": 0.0, "Pipeline": 0.0}
        for _ in range(2):
            for opt in sgd:
                opt.zero_grad()
            losses = [runner.step(x, y) for runner in runners]
            want = F.mse_loss(alone(x), y)
            want.backward()
            for label, other, loss in (
                ("one process", ref, want),
                ("Pipeline", fast, losses[1]),
            ):
                if losses[0] is not None:
                    found[label] = max(found[label], abs(losses[0] - loss).item())
                for s in runners[0].local:
                    for a, b in zip(
                        plain[s].parameters(), other[s].parameters(), strict=True
                    ):
                        diff = (a.grad - b.grad).abs().max().item()
                        found[label] = max(found[label], diff)
            for opt in sgd:
                opt.step()
        runners[1].close()
        out[name] = dict(found, loss=None if losses[0] is None else 1.0)
    return out


def _check(results: list[dict]) -> None:
    p = len(results)
    for name in MAKERS:
        losses = [r[name]["loss"] for r in results]
        assert losses == [None] * (p - 1) + [1.0], name  # a loss on the last rank
        for label in ("one process", "Pipeline"):
            assert max(r[name][label] for r in results) <= TOL, (name, label)


def test_plain_runner_equals_one_process_and_pipeline_on_two_ranks() -> None:
    _check(spawn(_differences, 2, 4, timeout=10))


def test_plain_runner_equals_one_process_and_pipeline_on_four_ranks() -> None:
    _check(spawn(_differences, 4, 4, timeout=20))


def _bad_input() -> dict[str, str]:
    """Each mistake is the same ValueError on every rank, and nothing is sent."""
    x, y = chain_batch()
    narrow = nn.Sequential(nn.Linear(8, 6), nn.Linear(8, 8))  # 6 out, 8 in
    pipe = PlainPipeline(
        pp.split_by_count(tanh_chain(), 2), pp.one_f_one_b(2, 4), F.mse_loss
    )
    cases = {
        "ranks": lambda: PlainPipeline(
            pp.split_by_count(tanh_chain(), 4), pp.one_f_one_b(4, 4), F.mse_loss
        ),
        "batch": lambda: pipe.step(x[:7], y[:7]),
        "fit": lambda: PlainPipeline(
            pp.split_by_count(narrow, 2), pp.gpipe(2, 4), F.mse_loss
        ).step(x, y),
    }
    errors = {}
    with Ledger() as ledger:
        for name, call in cases.items():
            with pytest.raises(ValueError) as err:
                call()
            errors[name] = str(err.value)
    assert ledger.records == []  # refused before any message
    pipe.step(x, y)  # nothing stray on the wire: the next step works
    return errors


def test_bad_input_is_refused_on_every_rank_before_any_message() -> None:
    e = refused_alike(_bad_input)
    assert e["ranks"] == (
        "schedule '1F1B' runs 4 stages on 4 ranks; got 4 stages, 2 ranks"
    )
    assert e["batch"] == "got a batch of 7: it must split into 4 equal micro-batches"
    assert e["fit"].startswith(
        "stage 1 cannot take the output of stage 0, float32[2, 6]: RuntimeError"
    )
