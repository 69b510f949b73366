"""`plan.measure`: chapter 10's layouts run on real gloo ranks, their peak memory and
wire bytes against the planner's (the chapter runs all six on 4 ranks; here two of
them on 2 ranks, where every share and message differs from the chapter's)."""

from __future__ import annotations

import pytest
import torch

from distcourse import plan
from distcourse.examples.gpt import GPTConfig, token_batches
from distcourse.launch import spawn
from distcourse.plan import measure

CFG = GPTConfig(vocab=128, block_size=32, n_layer=2, n_head=4, n_embd=64)
NAMES = ("ZeRO-2", "ZeRO-3, m 2")


def test_an_unknown_layout_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="unknown layout 'ZeRO-4'; known: DP, "):
        measure.layout_of("ZeRO-4", 4)


def test_every_layout_is_one_the_planner_accepts() -> None:
    hw = plan.named("h100")
    for name in measure.LAYOUTS:
        assert measure.predict(name, CFG, 8, 2, hw).layout.dp == 2


def _on_ranks() -> dict[str, dict]:
    torch.set_num_threads(1)
    batches = token_batches(3, 8, CFG)
    return {name: measure.run(name, CFG, batches) for name in NAMES}


def test_two_ranks_peak_near_the_plan_and_send_exactly_its_bytes() -> None:
    hw = plan.local(0.0, 0.0, 1e9, 2**30, 2)  # CPU ranks: the CPU's attention
    for got in spawn(_on_ranks, 2, timeout=60):
        for name in NAMES:
            planned = measure.predict(name, CFG, 8, 2, hw)
            ratio, same = measure.compared(got[name], planned)
            assert same, (name, got[name], planned.wire, planned.memory)
            assert abs(ratio - 1) <= 0.1, (name, ratio)
