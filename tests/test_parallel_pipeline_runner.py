"""Every schedule, run on real gloo ranks, equals one process on the whole batch;
activation memory is measured; bad input fails on every rank before any send."""

from __future__ import annotations

import re
import time

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from helpers import chain_batch, refused_alike, tanh_chain
from torch import nn

from distcourse.comm.ledger import Ledger
from distcourse.launch import spawn
from distcourse.parallel import pipeline as pp
from distcourse.runtime import RankError

TOL = 1e-6  # float32, batch 8: measured differences are about 1e-8
MAKERS = {
    "GPipe": lambda p, m: pp.gpipe(p, m),
    "1F1B": lambda p, m: pp.one_f_one_b(p, m),
    "interleaved": lambda p, m: pp.interleaved(p, m, 2),
    "ZB-H1": lambda p, m: pp.zb_h1(p, m),
    "interleaved, m < p": lambda p, m: pp.interleaved(p, 2, 2),  # one round of 2
}


def _against_one_process(names: list[str], m: int) -> dict[str, dict]:
    """On every rank: each schedule's loss and local gradients against one process."""
    p = dist.get_world_size()
    x, y = chain_batch()
    out = {}
    for name in names:
        schedule = MAKERS[name](p, m)
        ref = tanh_chain()
        loss = F.mse_loss(ref(x), y)
        loss.backward()
        stages = pp.split_by_count(tanh_chain(), schedule.stages)
        pipe = pp.Pipeline(stages, schedule, F.mse_loss, timeout=10)
        got = pipe.step(x, y)
        refs = pp.split_by_count(ref, schedule.stages)
        pairs = [
            (a, b)
            for s in pipe.local
            for a, b in zip(stages[s].parameters(), refs[s].parameters(), strict=True)
        ]
        diff = max((a.grad - b.grad).abs().max().item() for a, b in pairs)
        pipe.close()
        out[name] = dict(
            grad=diff,
            loss=None if got is None else abs(got.item() - loss.item()),
            peak=pipe.meter.peak,
            count=pipe.meter.peak_count,
            events=[pp.parse(e) for e in pipe.events],
        )
    return out


def _check(results: list[dict], names: list[str], m: int) -> None:
    p = len(results)
    for name in names:
        losses = [r[name]["loss"] for r in results]
        assert losses[:-1] == [None] * (p - 1) and losses[-1] <= TOL, name
        assert max(r[name]["grad"] for r in results) <= TOL, name
        for rank, r in enumerate(results):  # one F and one B per stage and micro-batch
            want = MAKERS[name](p, m).actions[rank]
            assert r[name]["events"] == [(a.kind, a.stage, a.micro) for a in want]


def test_every_schedule_equals_one_process_on_two_ranks() -> None:
    names, m = ["GPipe", "1F1B", "interleaved", "ZB-H1"], 4
    results = spawn(_against_one_process, 2, names, m, timeout=10)
    _check(results, names, m)
    # measured activation memory: GPipe holds m micro-batches, 1F1B p - r of them
    for rank, r in enumerate(results):
        gpipe, fb = r["GPipe"], r["1F1B"]
        assert (gpipe["count"], fb["count"]) == (m, 2 - rank)
        assert gpipe["peak"] * (2 - rank) == fb["peak"] * m > 0


def test_1f1b_interleaved_and_zb_h1_equal_one_process_on_four_ranks() -> None:
    names, m = ["1F1B", "interleaved", "ZB-H1", "interleaved, m < p"], 8
    results = spawn(_against_one_process, 4, names, m, timeout=20)
    _check(results, names, m)
    assert [r["1F1B"]["count"] for r in results] == [4, 3, 2, 1]  # <= p
    assert [r["ZB-H1"]["count"] for r in results] == [4, 4, 4, 4]  # held until W


def _bad_input() -> dict[str, str]:
    """Each mistake raises the same error on every rank, with no message sent."""
    x, y = chain_batch()
    model = tanh_chain()
    errors = {}
    cases = {
        "split": lambda: pp.split_by_count(model, 9),
        "stages": lambda: pp.Pipeline(
            pp.split_by_count(model, 3), pp.one_f_one_b(2, 4), F.mse_loss
        ),
        "ranks": lambda: pp.Pipeline(
            pp.split_by_count(model, 4), pp.one_f_one_b(4, 4), F.mse_loss
        ),
    }
    with Ledger() as ledger:
        for name, call in cases.items():
            with pytest.raises(ValueError) as err:
                call()
            errors[name] = str(err.value)
    assert ledger.records == []  # refused before any group or message
    narrow = nn.Sequential(nn.Linear(8, 6), nn.Linear(8, 8))  # 6 out, 8 in
    pipes = {
        "micro": pp.Pipeline(
            pp.split_by_count(model, 2), pp.one_f_one_b(2, 4), F.mse_loss, timeout=5
        ),
        "fit": pp.Pipeline(
            pp.split_by_count(narrow, 2), pp.one_f_one_b(2, 4), F.mse_loss, timeout=5
        ),
    }
    steps = {
        "batch": lambda: pipes["micro"].step(x[:7], y[:7]),
        "target": lambda: pipes["micro"].step(x, None),
        "fit": lambda: pipes["fit"].step(x, y),
    }
    with Ledger() as ledger:
        for name, call in steps.items():
            with pytest.raises(ValueError) as err:
                call()
            errors[name] = str(err.value)
    sent = [r.op for r in ledger.records if r.op in ("isend", "irecv")]
    assert sent == []  # only the agreement's all-gather ran
    pipes["micro"].step(x, y)  # nothing stray on the wire: the next step works
    return errors


def test_bad_input_fails_on_every_rank_before_any_send() -> None:
    e = refused_alike(_bad_input)
    assert e["split"] == (
        "cannot cut 8 layers into 9 stages: every stage needs at least one layer"
    )
    assert "3 stages for 2 ranks x 1 stages per rank = 2" in e["stages"]
    assert e["ranks"] == "schedule '1F1B' is for 4 ranks, the group has 2"
    assert e["batch"] == (
        "stage 0 (rank 0): a batch of 7 does not split into 4 equal micro-batches"
    )
    assert e["target"] == "stage 1 (rank 1) needs the target batch"
    assert e["fit"].startswith(
        "stage 1 (rank 1) cannot take the output of stage 0 "
        "(rank 0), float32[2, 6]: RuntimeError"
    )


class Leave(Exception):
    """Raised by the last stage's loss to leave mid-schedule."""


def _leaves(calls: list[int]) -> str:
    """Rank 1 quits after its first backward (its group gone); rank 0 must not hang."""
    x, y = chain_batch()
    me = dist.get_rank()

    def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        if len(calls) == 2:
            raise Leave("gone")
        return F.mse_loss(out, target)

    pipe = pp.Pipeline(
        pp.split_by_count(tanh_chain(), 2), pp.one_f_one_b(2, 4), loss_fn, timeout=3
    )
    with pytest.raises(RuntimeError) as err:
        pipe.step(x, y)
    if me == 1:
        dist.destroy_process_group()
    return str(err.value)


def test_a_rank_that_leaves_mid_schedule_is_named_and_nothing_hangs() -> None:
    start = time.monotonic()
    errors = spawn(_leaves, 2, [], timeout=3, deadline=40)
    assert time.monotonic() - start < 40
    assert errors[1] == "stage 1 (rank 1), F of micro-batch 1: gone"
    # where rank 0 is when rank 1 quits depends on timing: waiting for a gradient of
    # micro-batch 0 or 1, or still sending an activation; either way rank 1 is named
    waited = r"B of micro-batch [01]: waiting for a gradient from rank 1: "
    sending = r"F of micro-batch [0-3]: sending an activation to rank 1: "
    found = rf"stage 0 \(rank 0\), ({waited}|{sending})"
    assert re.match(found, errors[0]), errors[0]


def _dies() -> None:
    def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        import os

        os._exit(3)

    pipe = pp.Pipeline(
        pp.split_by_count(tanh_chain(), 2), pp.gpipe(2, 2), loss_fn, timeout=3
    )
    pipe.step(*chain_batch())


def test_a_rank_that_dies_is_named() -> None:
    # whichever is reported first, the dead rank or its neighbour, names rank 1
    died = r"rank 1 failed: process died \(exit code 3\)"
    waited = (
        r"stage 0 \(rank 0\), B of micro-batch 0: waiting for a gradient "
        r"from rank 1"
    )
    with pytest.raises(RankError, match=f"{died}|{waited}"):
        spawn(_dies, 2, timeout=3, deadline=40)


def _inputs_first() -> dict:
    """inputs="first": later steps skip the agreement and give the same losses; a
    changed batch raises on the rank that holds it."""
    rank, x, y = dist.get_rank(), *chain_batch()
    losses = {}
    for inputs in ("every", "first"):
        stages = pp.split_by_count(tanh_chain(), 2)
        pipe = pp.Pipeline(
            stages, pp.one_f_one_b(2, 4), F.mse_loss, timeout=5, inputs=inputs
        )
        with Ledger() as ledger:
            got = [pipe.step(x, y) for _ in range(3)]
        losses[inputs] = [None if g is None else g.item() for g in got]
        losses[inputs + " messages"] = len(ledger.records)
        if inputs == "first":
            try:
                pipe.step(x[:4] if rank == 0 else None, None if rank == 0 else y[:4])
                losses["changed"] = "no error"
            except (ValueError, RuntimeError) as err:
                losses["changed"] = str(err)
        pipe.close()
    return losses


def test_inputs_agreed_once_give_the_same_losses_with_fewer_messages() -> None:
    for rank, got in enumerate(spawn(_inputs_first, 2, timeout=30)):
        assert got["every"] == got["first"]
        assert got["first messages"] < got["every messages"]
        assert (
            "inputs='first' agreed on batches of 4 x torch.float32 [2, 8]"
            in (got["changed"])
            or rank == 1
            and "target batch 4 != the agreed 8" in got["changed"]
        )


def test_inputs_must_be_every_or_first() -> None:
    with pytest.raises(ValueError, match="inputs must be 'every' or 'first'"):
        pp.Pipeline(
            pp.split_by_count(tanh_chain(), 2),
            pp.one_f_one_b(2, 2),
            F.mse_loss,
            inputs="never",
        )
