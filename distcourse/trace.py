"""Timed events on one rank: what a step did and when, for timelines and checks.

DDP records its forward, backward, bucket all-reduces and final wait; a pipeline
schedule will record each micro-batch's forward and backward. Both are drawn by
`viz.timeline` and measured with the helpers here, so no strategy imports another to
share them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class Event:
    """One span on a rank's timeline; times are time.perf_counter() seconds."""

    name: str
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


@contextmanager
def span(events: list[Event], name: str) -> Iterator[None]:
    """Append an Event named `name` covering the body of the `with` block."""
    start = time.perf_counter()
    try:
        yield
    finally:
        events.append(Event(name, start, time.perf_counter()))


def overlap(a: Event, b: Event) -> float:
    """Seconds during which both spans ran (0 if they are disjoint)."""
    return max(0.0, min(a.end, b.end) - max(a.start, b.start))


def as_events(items: Sequence[Event | tuple[str, float, float]]) -> list[Event]:
    """Events from Events or (name, start, end) tuples, e.g. pulled from a rank."""
    return [
        e if isinstance(e, Event) else Event(str(e[0]), float(e[1]), float(e[2]))
        for e in items
    ]
