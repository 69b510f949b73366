"""trace: spans recorded around a block, their overlap, and tuples pulled from ranks."""

from __future__ import annotations

import time

import pytest

from distcourse.trace import (
    Event,
    Spans,
    as_events,
    covered,
    hidden_fraction,
    overlap,
    span,
)


def test_span_records_the_block_even_when_it_raises() -> None:
    events: list[Event] = []
    with span(events, "compute"):
        time.sleep(0.01)
    try:
        with span(events, "fails"):
            raise KeyError("x")
    except KeyError:
        pass
    assert [e.name for e in events] == ["compute", "fails"]
    assert events[0].seconds >= 0.01 and events[0].end <= events[1].start


def test_overlap_of_spans() -> None:
    backward, bucket = Event("backward", 0.0, 2.0), Event("all_reduce 0", 1.5, 3.0)
    assert overlap(backward, bucket) == overlap(bucket, backward) == 0.5
    assert overlap(backward, Event("later", 2.5, 3.0)) == 0.0


def test_as_events_accepts_events_and_tuples() -> None:
    mixed = [Event("a", 1.0, 2.0), ("b", 2, 3)]
    assert as_events(mixed) == [Event("a", 1.0, 2.0), Event("b", 2.0, 3.0)]


def test_covered_counts_overlapping_spans_once() -> None:
    spans = [Event("a", 0.0, 2.0), Event("b", 1.0, 3.0), Event("c", 5.0, 6.0)]
    assert covered(spans) == 4.0
    assert covered([Event("inner", 0.5, 1.0), Event("outer", 0.0, 2.0)]) == 2.0
    assert covered([]) == 0.0


def test_hidden_fraction_counts_only_what_completed_inside_backward() -> None:
    step = [
        ("backward", 0.0, 4.0),
        ("all_reduce 0", 1.0, 3.0),  # completed inside backward: 2 s hidden
        ("all_reduce 1", 2.0, 5.0),  # launched inside, completed after: none
        ("all_reduce 2", 4.0, 6.0),  # launched after the last gradient: none
        ("wait", 4.0, 6.0),
    ]
    assert hidden_fraction(step) == 2.0 / 5.0  # 2 s hidden of 5 s in flight
    assert hidden_fraction([("backward", 0, 4), ("all_reduce 0", 1, 3)]) == 1.0
    late = [("backward", 0.0, 4.0), ("all_reduce 0", 4.0, 6.0)]
    assert hidden_fraction(late) == 0.0  # one bucket sent after backward: nothing
    # launched early but served only after backward (gloo's queue): nothing proven
    queued = [("backward", 0.0, 4.0), ("all_reduce 0", 1.0, 4.5)]
    assert hidden_fraction(queued) == 0.0
    assert hidden_fraction([("backward", 0.0, 1.0)]) == 0.0
    with pytest.raises(ValueError, match="'backward'"):
        hidden_fraction([("all_reduce 0", 0.0, 1.0)])


class _DeviceLike:
    """A clock whose stamps are opaque marks, read only by `time` (as CUDA events
    are read after a synchronize): counts both, so the test sees when reading
    happens."""

    def __init__(self) -> None:
        self.now, self.stamps, self.reads = 0.0, 0, 0

    def stamp(self) -> object:
        self.stamps += 1
        self.now += 1.0
        return ("mark", self.now)

    def time(self, stamp: object) -> float:
        self.reads += 1
        return stamp[1]  # type: ignore[index]


def test_spans_stamp_the_device_and_read_it_only_when_asked() -> None:
    clock = _DeviceLike()
    spans = Spans(clock)
    with spans.span("F 0 0"):
        pass
    try:
        with spans.span("B 0 0"):
            raise KeyError("x")
    except KeyError:
        pass
    assert (clock.stamps, clock.reads) == (4, 0)  # no read during the step
    got = spans.events()
    assert got == [Event("F 0 0", 1.0, 2.0), Event("B 0 0", 3.0, 4.0)]
    assert spans.events() is got and clock.reads == 4  # read once, then kept
    spans.clear()
    assert spans.events() == []
