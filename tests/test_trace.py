"""trace: spans recorded around a block, their overlap, and tuples pulled from ranks."""

from __future__ import annotations

import time

from distcourse.trace import Event, as_events, overlap, span


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
