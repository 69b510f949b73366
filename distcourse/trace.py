"""Timed events on one rank: what a step did and when, for timelines and checks.

DDP records its forward, backward, bucket all-reduces and final wait; a pipeline
schedule records each micro-batch's forward and backward. Both are drawn by
`viz.timeline` and measured with the helpers here, so no strategy imports another to
share them.

Device work is timed on the device: `Spans` takes a clock with `stamp()` and
`time(stamp)` (`clock.DeviceTimer`: CUDA events on a GPU, a synchronize before the
host clock elsewhere) and reads its stamps once, when the events are asked for, so
a step does not wait for the device between its actions. `span` reads the host
clock: for host work only.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class Event:
    """One span on a rank's timeline; times are time.perf_counter() seconds."""

    name: str
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


class Clock(Protocol):
    """What `Spans` needs of a clock (clock.DeviceTimer has it)."""

    def stamp(self) -> Any: ...

    def time(self, stamp: Any) -> float: ...


class Spans:
    """Named spans of device work on one rank, stamped on `clock` and turned into
    Events (seconds on one axis, comparable across the processes of a machine)
    only when `events()` is called: on a GPU the stamps are events on the stream,
    read after one synchronize, so recording them costs the step no waiting."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.marks: list[tuple[str, Any, Any]] = []
        self.read: list[Event] | None = None

    @contextmanager
    def span(self, name: str) -> Iterator[None]:
        """Stamp the start and the end of the `with` block's device work."""
        start = self.clock.stamp()
        try:
            yield
        finally:
            self.marks.append((name, start, self.clock.stamp()))
            self.read = None

    def events(self) -> list[Event]:
        """The spans so far, as Events (read once, then kept until the next span)."""
        if self.read is None:
            t = self.clock.time
            self.read = [Event(n, t(a), t(b)) for n, a, b in self.marks]
        return self.read

    def clear(self) -> None:
        self.marks, self.read = [], None


@contextmanager
def span(events: list[Event], name: str) -> Iterator[None]:
    """Append an Event named `name` covering the body of the `with` block, on the
    host clock: for host work (device work: `Spans`)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        events.append(Event(name, start, time.perf_counter()))


def overlap(a: Event, b: Event) -> float:
    """Seconds during which both spans ran (0 if they are disjoint)."""
    return max(0.0, min(a.end, b.end) - max(a.start, b.start))


def covered(events: Sequence[Event]) -> float:
    """Seconds during which at least one of the spans ran (overlaps counted once)."""
    total, reach = 0.0, float("-inf")
    for e in sorted(events, key=lambda e: e.start):
        if e.end > reach:
            total += e.end - max(e.start, reach)
            reach = e.end
    return total


def hidden_fraction(
    events: Sequence[Event | tuple[str, float, float]],
    comm: str = "all_reduce",
    behind: str = "backward",
) -> float:
    """Share of the time communication was in flight that backward provably hid: 0 to 1.

    DDP's point is to hide its all-reduces behind backward. Of the seconds during which
    some span named `comm ...` (e.g. "all_reduce 0", from launch to completion) was in
    flight, overlapping spans counted once, this counts only the part, inside the span
    named `behind`, of spans that *completed* before `behind` ended. A span launched
    during backward that completed after it counts nothing: it may have sat in gloo's
    queue all along, and being launched early proves no overlap. So a DDP that sends
    its all-reduces only after backward, or whose launches wait unserved until
    backward ends, scores exactly 0. 0.0 when there is no communication.
    """
    items = as_events(events)
    windows = [e for e in items if e.name == behind]
    if len(windows) != 1:
        raise ValueError(f"need exactly one span named {behind!r}, got {len(windows)}")
    window = windows[0]
    sent = [e for e in items if e.name.split()[0] == comm]
    inside = [
        Event(e.name, max(e.start, window.start), e.end)
        for e in sent
        if e.end <= window.end and overlap(e, window) > 0
    ]
    busy = covered(sent)
    return covered(inside) / busy if busy > 0 else 0.0


def as_events(items: Sequence[Event | tuple[str, float, float]]) -> list[Event]:
    """Events from Events or (name, start, end) tuples, e.g. pulled from a rank."""
    return [
        e if isinstance(e, Event) else Event(str(e[0]), float(e[1]), float(e[2]))
        for e in items
    ]
