"""Reading a failed run: where the ranks' records part, and what each rank was doing.

Everything here reads what the ranks recorded (comm/recorder.py's Entries) after the
run, in the launcher. The text is the same on every machine: it names ranks, calls,
shapes and bytes, never a port, a path or a process id; the run's seconds are its
only measured number.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

from distcourse.comm.recorder import Entry

SHOWN = 3  # calls shown per rank


def ranks_text(ranks: Sequence[int]) -> str:
    """'rank 1', 'ranks 0 and 2', 'ranks 0, 1 and 3'."""
    ranks = sorted(set(ranks))
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    head = ", ".join(str(r) for r in ranks[:-1])
    return f"ranks {head} and {ranks[-1]}"


def ranks_in(text: str) -> set[int]:
    """The ranks a sentence names as `ranks_text` writes them ('ranks 0 and 2')."""
    found: set[int] = set()
    for group in re.findall(r"\branks? (\d+(?:(?:, | and )\d+)*)", text):
        found.update(int(n) for n in re.findall(r"\d+", group))
    return found


def first_sentence(err: BaseException | str) -> str:
    """An error's message in one sentence: no '[file.cpp:12]' prefix, no traceback."""
    text = str(err).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    text = lines[0] if lines else type(err).__name__
    text = re.sub(r"^\[[^\]]*\]\s*", "", text)
    cut = text.find(". ")
    return text if cut < 0 else text[: cut + 1]


def _collectives(entries: list[Entry]) -> list[Entry]:
    return [e for e in entries if e.kind == "collective"]


def divergence(entries: list[list[Entry]]) -> tuple[int, list[str]] | None:
    """The first collective (counted per rank, from 1) where the ranks' calls differ
    (op, tensor or group), or that some ranks never entered; with a line per kind of
    call. None when every rank made the same collectives.

    Whether a rank came back from that call is not said: after a mismatch, which
    rank gloo aborts first, and whether another got enough bytes to return, is a
    race; what each rank called is not."""
    calls = [_collectives(found) for found in entries]
    longest = max((len(c) for c in calls), default=0)
    for k in range(longest):
        seen: dict[str, list[int]] = {}
        for rank, mine in enumerate(calls):
            text = mine[k].call() if k < len(mine) else "never entered it"
            seen.setdefault(text, []).append(rank)
        if len(seen) > 1:
            return k + 1, [f"{ranks_text(r)}: {text}" for text, r in seen.items()]
    return None


def unmatched_messages(entries: list[list[Entry]]) -> list[str]:
    """Point-to-point messages that do not pair up: for each sender and receiver,
    how many messages one sent and the other posted receives for, where they differ."""
    sent: Counter[tuple[int, int]] = Counter()
    received: Counter[tuple[int, int]] = Counter()
    for rank, found in enumerate(entries):
        for e in found:
            if e.kind == "send" and e.peer is not None:
                sent[(rank, e.peer)] += 1
            elif e.kind == "recv" and e.peer is not None:
                received[(e.peer, rank)] += 1
    lines = []
    for src, dst in sorted(set(sent) | set(received)):
        s, r = sent[(src, dst)], received[(src, dst)]
        if s != r:
            lines.append(
                f"rank {src} sent {s} message(s) to rank {dst}, "
                f"which posted {r} receive(s) from it"
            )
    return lines


def state(entries: list[Entry], status: str) -> str:
    """How a rank ended, from its record: stuck in a call, finished, or stopped."""
    waiting = next((e for e in reversed(entries) if not e.returned), None)
    if waiting is not None:
        return f"stuck in #{waiting.seq} {waiting.call()}"
    return {
        "finished": "finished its program",
        "reader": "stopped in your function",
        "error": "raised an error",
    }.get(status, "stopped between calls")


def _nth_collective(found: list[Entry], n: int) -> int | None:
    """The index in `found` of this rank's `n`-th collective (from 1), if any."""
    count = 0
    for i, e in enumerate(found):
        count += e.kind == "collective"
        if count == n:
            return i
    return None


def calls_by_rank(
    entries: list[list[Entry]], upto: int | None = None, shown: int | None = SHOWN
) -> list[list[str]]:
    """Each rank's last `shown` calls (all if None), up to its `upto`-th collective
    if given; that one is shown as entered, not whether it returned (see
    `divergence`)."""
    ranks = []
    for found in entries:
        part = None if upto is None else _nth_collective(found, upto)
        cut = len(found) if part is None else part + 1
        first = 0 if shown is None else max(cut - shown, 0)
        lines = [
            f"#{e.seq} {e.call()}, entered" if i == part else e.describe()
            for i, e in enumerate(found[first:cut], start=first)
        ]
        ranks.append(lines or ["no call recorded"])
    return ranks


def last_calls(entries: list[list[Entry]], upto: int | None = None) -> list[str]:
    """`calls_by_rank` as indented lines, each rank's first one headed 'rank r:'."""
    lines = []
    for rank, calls in enumerate(calls_by_rank(entries, upto)):
        head = f"  rank {rank}:"
        for call in calls:
            lines.append(f"{head} {call}")
            head = " " * len(head)
    return lines
