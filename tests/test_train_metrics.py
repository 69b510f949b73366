"""What a run measures: the planner's bytes for the trainer's layout (or its
reason to refuse one), a step's peak measured on the CPU beside them, no MFU
without a datasheet peak, and records written as JSON lines and to TensorBoard."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from distcourse import plan
from distcourse.examples.gpt import GPTConfig
from distcourse.launch import spawn
from distcourse.plan import memory as plan_memory
from distcourse.train.layout import TrainLayout
from distcourse.train.metrics import (
    Metrics,
    datasheet_peak,
    hardware,
    plan_layout,
    planned_bytes,
    policy,
)

CFG = GPTConfig(vocab=64, block_size=16, n_layer=4, n_head=4, n_embd=32)


def test_the_planners_bytes_for_the_trainers_layout() -> None:
    layout = TrainLayout(dp=2, pp=2, tp=2, micro_batches=2, zero=1)
    mine = plan_layout(layout)
    assert (mine.dp, mine.tp, mine.pp, mine.micro_batches, mine.zero) == (2, 2, 2, 2, 1)
    got, why = planned_bytes(layout, CFG, 8, "adamw", 1)
    spec = plan.ModelSpec.from_config(CFG)
    fused = plan.DTypePolicy("fp32", "fp32", "adamw-fused")  # the CPU's AdamW
    cpu = hardware(torch.device("cpu"), 8)
    assert cpu.workspace == 0 and cpu.arch == "cpu"
    moments = plan_memory.rank_moments(spec, 8, fused, mine, 1, cpu)
    assert why == "" and got == plan_memory.peak(moments)[1]["total"]
    assert plan_layout(TrainLayout(dp=2, fsdp=True, ckpt="full")).reshard is False
    assert policy(TrainLayout(dtype="bf16"), "sgd").dtype == "amp-bf16"
    assert policy(TrainLayout(), "adamw", fused=False).optimizer == "adamw"
    refused, why = planned_bytes(TrainLayout(pp=4, micro_batches=2), CFG, 8, "sgd", 0)
    assert refused is None and "micro_batches" in why  # 1F1B's m >= pp rule


def test_no_datasheet_peak_on_a_cpu() -> None:
    assert datasheet_peak(torch.device("cpu"), "bfloat16") is None


def _records(path: str, board: str) -> dict:
    m = Metrics(TrainLayout(dp=2), CFG, 8, "adamw", 0, path=path, tensorboard=board)
    first = m.record(1, 4.0, 0.5, 1e-3, peak=1000 + torch.distributed.get_rank())
    second = m.record(2, 3.5, 0.25, 1e-3, peak=None, grad_norm=0.7, eval_loss=3.9)
    m.close()
    return dict(first=first, second=second)


def test_records_are_json_lines_and_tensorboard_events(tmp_path: Path) -> None:
    path, board = tmp_path / "m.jsonl", tmp_path / "tb"
    found = spawn(_records, 2, str(path), str(board), timeout=60)
    first, second = found[0]["first"], found[0]["second"]
    assert first["tokens_per_s"] == 8 * 16 / 0.5 and first["mfu"] is None
    assert first["peak_bytes"] == [1000, 1001] == second["peak_bytes"]  # kept
    assert (
        first["planned_bytes"][0]
        == planned_bytes(TrainLayout(dp=2), CFG, 8, "adamw", 0)[0]
    )
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows == [first, second]  # rank 0 writes, once
    assert second["grad_norm"] == 0.7 and second["eval_loss"] == 3.9
    assert list(board.glob("events.out.tfevents.*"))
