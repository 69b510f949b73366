"""distcourse.viz.recorded: each rank's recorded calls, messages joined to their
receives, and where the ranks part (chapter 11)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from distcourse import viz  # noqa: E402
from distcourse.comm.recorder import Entry  # noqa: E402
from distcourse.viz import recorded as calls  # noqa: E402


def entry(seq: int, op: str, kind: str, peer: int | None, ok: bool) -> Entry:
    return Entry(seq, op, kind, "float32[2, 4]", 32, peer, (0, 1), ok)


def test_a_recorded_line_reads_back_as_the_call_it_describes() -> None:
    for e in (
        entry(3, "isend", "send", 1, True),
        entry(6, "recv", "recv", 0, False),
        entry(2, "all_reduce", "collective", None, True),
        Entry(2, "all_reduce", "collective", "float32[]", 4, None, (0, 1), False),
    ):
        call = calls.parse(e.describe())
        got = (call.seq, call.op, call.kind, call.peer, call.returned)
        assert got == (e.seq, e.op, e.kind, e.peer, e.returned)
    entered = calls.parse("#2 all_reduce float32[] (4 B), entered")
    assert not entered.returned and entered.label() == "#2 all_reduce scalar"
    assert calls.parse("#3 isend float32[2, 4] to rank 1 (32 B), returned").label() == (
        "#3 isend → rank 1"
    )
    with pytest.raises(ValueError, match="not a recorded call"):
        calls.parse("rank 0: stuck")


def lanes(*by_rank: list[Entry]) -> list[list[str]]:
    return [[e.describe() for e in lane] for lane in by_rank]


def test_sends_pair_with_receives_in_order_and_the_extra_send_is_lost() -> None:
    rank0 = [entry(k, "isend", "send", 1, True) for k in (1, 2, 3)]
    rank1 = [entry(k, "recv", "recv", 0, True) for k in (1, 2)]
    parsed = [[calls.parse(x) for x in lane] for lane in lanes(rank0, rank1)]
    joined, lost = calls.pairs(parsed)
    assert joined == [((0, 0), (1, 0)), ((0, 1), (1, 1))]
    assert lost == [(0, 2, 1)]
    fig = viz.calls(lanes(rank0, rank1))
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels == ["send", "receive", "never returned", "no receive took it"]


def test_the_first_collective_the_ranks_call_differently_is_where_they_part() -> None:
    same = entry(1, "all_reduce", "collective", None, True)
    mine = Entry(2, "all_reduce", "collective", "float32[]", 4, None, (0, 1), False)
    theirs = entry(2, "all_reduce", "collective", None, False)
    parsed = [
        [calls.parse(x) for x in lane] for lane in lanes([same, mine], [same, theirs])
    ]
    assert calls.parting(parsed) == [(0, 1), (1, 1)]
    assert calls.parting([parsed[0], parsed[0]]) == []
    # a rank that never entered the collective parts too
    assert calls.parting([parsed[0], parsed[0][:1]]) == [(0, 1)]
    fig = viz.calls(lanes([same, mine], [same, theirs]) + [[calls.NOTHING]])
    assert "the ranks part here" in [t.get_text() for t in fig.axes[0].texts]
