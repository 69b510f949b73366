"""comm/recorder.py: the flight recorder notes each call before it runs, marks it
when it returns, and leaves the same entries in its file as in memory."""

from __future__ import annotations

import os
import tempfile

import torch
import torch.distributed as dist

from distcourse.comm.recorder import Entry, FlightRecorder, read_entries, tensor_text
from distcourse.launch import spawn


def test_tensor_text_names_dtype_and_shape() -> None:
    assert tensor_text(torch.zeros(8, 4)) == "float32[8, 4]"
    assert tensor_text(torch.zeros((), dtype=torch.int64)) == "int64[]"
    assert tensor_text([torch.zeros(3)] * 2) == "2 x float32[3]"
    assert tensor_text(None) == ""


def _record(folder: str) -> tuple[list[Entry], list[Entry], object]:
    rank = dist.get_rank()
    path = os.path.join(folder, f"rank{rank}.jsonl")
    with FlightRecorder(path) as rec:
        dist.all_reduce(torch.ones(8, 4))
        pieces = [torch.empty(3) for _ in range(2)]
        dist.all_gather(pieces, torch.ones(3))
        if rank == 0:
            dist.isend(torch.ones(2), 1).wait()
        else:
            dist.recv(torch.empty(2), 0)
        waiting = rec.waiting()
        rec.note(status="finished")
    found, facts = read_entries(path)
    return rec.entries, found, (waiting, facts)


def test_entries_in_memory_and_in_the_file_agree() -> None:
    with tempfile.TemporaryDirectory() as folder:
        results = spawn(_record, 2, folder, timeout=10)
    for memory, found, (waiting, facts) in results:
        assert memory == found
        assert waiting is None and facts == {"status": "finished"}
        assert [e.seq for e in found] == [1, 2, 3]
        assert all(e.returned for e in found)
        assert found[0].describe() == "#1 all_reduce float32[8, 4] (128 B), returned"
        assert found[1].call() == "all_gather float32[3] (12 B)"
        assert found[0].ranks == (0, 1)
    assert results[0][1][2].call() == "isend float32[2] to rank 1 (8 B)"
    assert results[1][1][2].call() == "recv float32[2] from rank 0 (8 B)"


def test_a_missing_file_has_no_entries() -> None:
    assert read_entries("/nonexistent/rank0.jsonl") == ([], {})
