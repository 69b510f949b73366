"""`Lab`: one broken program, `run()` to see its symptom, `check(fix)` to test a fix.

A lab names its program (what each rank runs, calling the function the reader will
fix), the broken function, the signature a fix must have, and `compare`: the
launcher-side comparison of every rank's outputs with one process (and with each
other), returning the differences as sentences.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from distcourse.labs import report
from distcourse.labs.core import DEFAULT_TIMEOUT, Outcome, check_function, execute


@dataclass(frozen=True)
class Report:
    """What a run showed: `kind` is "hang" (calls that never returned: the group's
    timeout ended them, or gloo aborted a rank), "error", "reader" (the reader's
    function failed), "timeout" (past the deadline), "silent"
    (every rank finished, but not as one process) or "ok"; `ranks` are the ranks the
    report names; `text` is the report itself; `by_rank` each rank's calls."""

    lab: str
    kind: str
    ranks: tuple[int, ...]
    seconds: float
    text: str
    by_rank: tuple[tuple[str, ...], ...] = ()  # each rank's recorded calls

    def columns(self) -> list[list[str]]:
        """Each rank's recorded calls (up to where the ranks part), as a list per
        rank: for `launch.columns.show`, a column per rank."""
        return [list(calls) for calls in self.by_rank]

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class Verdict:
    """A check's result: `passed`, and the lines to show (the verdict line ends in
    PASS or FAIL; a FAIL is followed by what differed and a hint)."""

    lab: str
    passed: bool
    lines: tuple[str, ...]

    def __str__(self) -> str:
        return "\n".join(self.lines)

    def __bool__(self) -> bool:
        return self.passed


def _describe(outcome: Outcome, problems: list[str]) -> tuple[str, list[str], set]:
    """The kind of failure, its lines, and the ranks they name."""
    named: set[int] = set()
    lines: list[str] = []
    if outcome.overran:
        why = "the run did not end within its deadline: does a function loop forever?"
        return "timeout", [why], named
    for status in ("reader", "error"):
        for message, ranks in outcome.messages(status).items():
            named.update(ranks)
            lines.append(f"{report.ranks_text(ranks)}: {message}")
        if lines:
            return status, lines, named
    stuck = [r for r, e in enumerate(outcome.entries) if any(not x.returned for x in e)]
    found = report.divergence(outcome.entries)
    unmatched = report.unmatched_messages(outcome.entries)
    if stuck or outcome.died is not None or found or unmatched:
        kind = "hang"  # or a rank that gloo aborted: which comes first is a race
        if found:
            k, parts = found
            lines.append(f"the ranks part at collective #{k}:")
            lines += [f"  {p}" for p in parts]
            named.update(range(outcome.world))
        lines += unmatched
        named.update(stuck)
        if not found:  # after a mismatch, how each rank ended is a race
            lines.append("how each rank ended:")
            for rank, entries in enumerate(outcome.entries):
                ended = report.state(entries, outcome.statuses[rank])
                lines.append(f"  rank {rank}: {ended}")
        upto = found[0] if found else None
        lines.append("its last calls (flight recorder):")
        lines += report.last_calls(outcome.entries, upto)
        return kind, lines, named
    if problems:
        for line in problems:
            named.update(report.ranks_in(line))
        return "silent", problems, named
    return "ok", [], named


@dataclass(frozen=True)
class Lab:
    """A broken program on `world` ranks, the function to fix, and how to judge it."""

    name: str
    title: str
    world: int
    program: Callable[..., Any]  # program(fix, rank, world) -> outputs, on each rank
    broken: Callable[..., Any]
    signature: str  # how the program calls the function, e.g. "f(loss, rank, world)"
    compare: Callable[[list[Any]], list[str]]  # outputs by rank -> differences
    hint: str

    def _outcome(
        self, fn: Callable[..., Any], timeout: float, limit: float | None = None
    ) -> Outcome:
        return execute(self.program, fn, self.world, timeout, limit)

    def _problems(self, outcome: Outcome) -> list[str]:
        if all(e is not None and e["status"] == "finished" for e in outcome.endings):
            return self.compare([e["out"] for e in outcome.endings])
        return []

    def run(self, timeout: float = DEFAULT_TIMEOUT) -> Report:
        """Run the broken program; the report of what went wrong, in seconds."""
        return self.report(self.broken, timeout)

    def report(
        self, fn: Callable[..., Any], timeout: float = DEFAULT_TIMEOUT
    ) -> Report:
        """Run the program with `fn`; a Report of how it ended."""
        outcome = self._outcome(fn, timeout)
        kind, lines, named = _describe(outcome, self._problems(outcome))
        head = {
            "hang": "calls that never returned; the run stopped them, no hang",
            "silent": "no hang: every rank finished, but not as one process",
            "ok": "every rank finished and matches one process",
            "timeout": "stopped at its deadline",
        }.get(kind, "an error on a rank")
        first = f"{self.name} on {self.world} ranks, {outcome.seconds:.1f} s: {head}"
        text = "\n".join([first, *lines])
        found = report.divergence(outcome.entries)
        calls = report.calls_by_rank(outcome.entries, found and found[0], None)
        by_rank = tuple(tuple(c) for c in calls)
        named_ranks = tuple(sorted(named))
        return Report(self.name, kind, named_ranks, outcome.seconds, text, by_rank)

    def check(
        self, fix: Any, timeout: float = DEFAULT_TIMEOUT, limit: float | None = None
    ) -> Verdict:
        """Run the program with the reader's `fix`: PASS if every rank matches one
        process, else FAIL with what differed and a hint. Never raises for a bad fix
        (not a function, or one of the wrong arguments, is a FAIL that says so).
        Collectives wait `timeout` seconds; the run ends within `limit` seconds
        (default: core.deadline(timeout))."""
        head = f"{self.name}: your fix on {self.world} ranks against one process"
        try:
            check_function(fix, self.signature)
        except TypeError as err:
            return Verdict(self.name, False, (f"{head}: FAIL", f"  {err}"))
        outcome = self._outcome(fix, timeout, limit)
        kind, lines, _ = _describe(outcome, self._problems(outcome))
        if kind == "ok":
            return Verdict(self.name, True, (f"{head}: PASS",))
        why = [f"  {line}" for line in lines]
        return Verdict(self.name, False, (f"{head}: FAIL", *why, f"hint: {self.hint}"))
