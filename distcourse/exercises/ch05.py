"""Chapter 5's exercises: the bubble, the 1F1B order, memory in flight, transfers.

1. `check_bubble(x)`: the idle share of 4 ranks' time under 1F1B with 8
   micro-batches (equal forward and backward times).
2. `check_one_f_one_b(fn)`: `fn(p, m)` returns 1F1B's order on p ranks for m
   micro-batches: for each rank, its actions as strings "F<stage>.<micro>" and
   "B<stage>.<micro>" (rank r holds stage r), as `Schedule.show()` prints them.
   Checked for several p and m: every action once, every forward before its
   backward, sends and receives in the same order (no deadlock), and 1F1B's order.
3. `check_peak_in_flight(x)`: under 1F1B on 4 ranks with 16 micro-batches, at most
   how many micro-batches' activations does rank 0 hold at once?
4. `check_interleaved_transfers(x)`: how many activation and gradient transfers
   between ranks one step of interleaved 1F1B makes on 2 ranks with v = 4 stages
   per rank and 4 micro-batches (`pp.transfers` counts them)?
"""

from __future__ import annotations

import re

from distcourse.exercises.core import Problem, call, check_answer, check_number
from distcourse.parallel.pipeline.schedules import (
    Action,
    Schedule,
    bubble_formula,
    check,
    in_flight,
    interleaved,
    one_f_one_b,
    transfers,
)

EXERCISES = ("bubble", "one_f_one_b", "peak_in_flight", "interleaved_transfers")
ACTION = re.compile(r"([FB])(\d+)\.(\d+)")
CASES = ((2, 4), (4, 8), (4, 2), (3, 5), (1, 3))  # (p, m)


def check_bubble(answer: object) -> bool:
    """The bubble fraction of 1F1B, p = 4, m = 8: a number in [0, 1)."""
    return check_number(
        "ch05.bubble",
        answer,
        bubble_formula(4, 8),
        rel=1e-3,
        hint="each rank idles p - 1 slots out of m + p - 1: (p - 1) / (m + p - 1)",
    )


def _parse(p: int, m: int, got: object) -> tuple[Schedule | None, Problem]:
    """The answer's order as a Schedule, or what is wrong with its form."""
    rows = got.actions if isinstance(got, Schedule) else got
    if not isinstance(rows, list | tuple) or len(rows) != p:
        return None, f"p={p}: expected a list of {p} lists (one per rank)"
    actions = []
    for r, row in enumerate(rows):
        if not isinstance(row, list | tuple):
            return None, f"p={p}: rank {r}'s entry is not a list"
        parsed = [ACTION.fullmatch(str(a)) for a in row]
        bad = next((a for a, ok in zip(row, parsed, strict=True) if not ok), None)
        if bad is not None:
            return None, f"rank {r}: {bad!r} is not an action such as 'F0.1'"
        fields = [x.groups() for x in parsed]
        actions.append(tuple(Action(k, int(s), int(j)) for k, s, j in fields))
    return Schedule("your order", p, m, 1, tuple(actions)), None


def _judge_order(answer: object) -> Problem:
    if not callable(answer):
        return f"expected a function of (p, m), got {type(answer).__name__}"
    for p, m in CASES:
        schedule, problem = _parse(p, m, call(answer, p, m))
        if problem:
            return problem
        try:
            check(schedule)
        except ValueError as err:
            return f"p={p}, m={m}: {err}"
        want = one_f_one_b(p, m)
        peak, most = in_flight(schedule), in_flight(want)
        for r in range(p):
            if peak[r] > most[r]:
                return (
                    f"p={p}, m={m}: rank {r} holds {peak[r]} micro-batches at once; "
                    f"1F1B holds at most {most[r]}"
                )
        if schedule.actions != want.actions:
            r = next(r for r in range(p) if schedule.actions[r] != want.actions[r])
            return f"p={p}, m={m}: rank {r}'s order differs from 1F1B's"
    return None


def check_one_f_one_b(answer: object) -> bool:
    """`answer(p, m) -> [[action, ...] per rank]`, checked for five (p, m)."""
    return check_answer(
        "ch05.one_f_one_b",
        answer,
        _judge_order,
        hint="rank r runs min(p - 1 - r, m) forwards to warm up, then alternates "
        "one forward and one backward, and ends with the backwards left",
    )


def check_peak_in_flight(answer: object) -> bool:
    """Micro-batches rank 0 holds at most, 1F1B, p = 4, m = 16: a number."""
    return check_number(
        "ch05.peak_in_flight",
        answer,
        in_flight(one_f_one_b(4, 16))[0],
        hint="1F1B starts a new forward only after a backward once warm: rank r "
        "holds p - r, whatever m is (GPipe would hold all m)",
    )


def check_interleaved_transfers(answer: object) -> bool:
    """Transfers per step, interleaved 1F1B, p = 2, v = 4, m = 4: a number."""
    count = sum(len(sent) for sent, _ in transfers(interleaved(2, 4, 4)).values())
    return check_number(
        "ch05.interleaved_transfers",
        answer,
        count,
        hint="every micro-batch crosses each of the p*v - 1 stage boundaries twice, "
        "once forward (activation) and once backward (gradient)",
    )
