"""distcourse.comm.backends: the live column on real gloo ranks, and the table."""

from __future__ import annotations

import pytest

from distcourse import torchcompat
from distcourse.comm import backends
from distcourse.launch import spawn


@pytest.mark.parametrize("world_size", [2, 3])
def test_every_operation_runs_on_gloo_cpu_as_the_docs_say(world_size: int) -> None:
    found = spawn(backends.try_each, world_size)
    assert all(f == found[0] for f in found)  # every rank reports the same
    docs = dict(zip(backends.OPS, backends.DOCS["gloo CPU"], strict=True))
    if not torchcompat.GLOO_ALL_TO_ALL:  # torch 2.11's gloo has all_to_all_single only
        docs["all_to_all"] = "✘"
    assert found[0] == docs


def test_a_failing_operation_is_marked_and_the_table_says_what_is_cited() -> None:
    assert all(len(col) == len(backends.OPS) for col in backends.DOCS.values())
    measured = dict.fromkeys(backends.OPS, "✓") | {"barrier": "✘"}
    text = backends.table(measured, "gloo CPU")
    names, devices, kinds, *rows, last = text.splitlines()
    assert names.split() == ["gloo", "gloo", "mpi", "mpi", "nccl", "nccl"]
    assert devices.split() == ["CPU", "GPU", "CPU", "GPU", "CPU", "GPU"]
    assert kinds.split() == ["operation", "(run)"] + ["(docs)"] * (
        len(backends.DOCS) - 1
    )
    assert [row.split()[0] for row in rows] == list(backends.OPS)
    assert rows[-1].split()[1] == "✘"
    assert last == "gloo CPU: run and docs agree on 10 of 11 operations"
    other = backends.table(measured, "gloo CPU, 2 ranks")  # no docs column of its name
    assert "agree" not in other and other.splitlines()[0].split().count("gloo") == 3


def test_try_each_needs_a_process_group_and_two_ranks() -> None:
    with pytest.raises(RuntimeError):
        backends.try_each()
    with pytest.raises(Exception, match="at least 2 ranks"):
        spawn(backends.try_each, 1)
