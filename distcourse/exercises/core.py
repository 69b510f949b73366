"""The checks behind every chapter's exercises: run an answer, compare, say one line.

A check prints exactly one line and returns a bool:

    ch02.ring_all_reduce: PASS
    ch02.ring_all_reduce: FAIL — rank 1 holds 6.0 where 10.0 was expected — hint: ...
    ch02.ring_all_reduce: not answered yet — hint: ...

Answers of every kind, a helper each:

- `check_number(name, answer, expected, hint=...)`: a number, compared in-process
  within a relative tolerance.
- `check_answer(name, answer, judge, hint=...)`: anything else checked in-process (a
  schedule, a layout, a table of signatures, a small pure function); `judge(answer)`
  returns what is wrong, or None.
- `check_table(name, answer, expected, hint=...)`: a dict (signatures, groups),
  entry by entry; strings compare without spaces or case ('s(0)' is 'S(0)').
- `check_per_rank(name, answer, expected, what=..., hint=...)`: a list with one
  entry per rank (pieces' shapes, shards' rows), entry by entry as in a table.
- `check_returns(name, answer, args, expected, hint=...)`: a function run in this
  process on `args`, whose tuple of tensors is compared, by name, with `expected`.
- `check_on_ranks(name, answer, probe, world_size, hint=...)`: a function that runs on
  real gloo ranks (`launch.spawn`); `probe(answer)` runs on every rank, calls the
  answer through `call`, and returns what is wrong on that rank, or None.

Whatever the reader hands in, the reader sees a sentence, never a traceback from
inside the package: a wrong type, a wrong shape, an exception raised by the reader's
code (`call` names it), a hang (every run on ranks has a finite time limit, and
`spawn` leaves no process behind).
"""

from __future__ import annotations

import math
import numbers
import re
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from distcourse.launch.spawn import spawn
from distcourse.runtime import RankError

Problem = str | None  # what is wrong with an answer; None when nothing is

# seconds: each collective's timeout on the ranks, and the whole run's limit
COLLECTIVE_TIMEOUT = 8.0
RUN_LIMIT = 30.0
IN_PROCESS_LIMIT = 10.0  # seconds for an answer judged in this process


_HANG = "a recv with no matching send, or a collective that some ranks skip?"


class AnswerError(Exception):
    """The reader's code raised: carries the sentence shown instead of a traceback."""


def say(name: str, problem: Problem, hint: str) -> bool:
    """Print the verdict line for exercise `name`; True when `problem` is None."""
    if problem is None:
        print(f"{name}: PASS")
        return True
    print(f"{name}: FAIL — {_one_line(problem)} — hint: {_one_line(hint)}")
    return False


def not_answered(name: str, hint: str) -> bool:
    """The line for a placeholder answer (None): no verdict, only the hint."""
    print(f"{name}: not answered yet — hint: {_one_line(hint)}")
    return False


def _one_line(text: str) -> str:
    return re.sub(r"\s+", " ", str(text)).strip()


def call(fn: Any, *args: Any, what: str = "your function") -> Any:
    """Call the reader's `fn`; an exception becomes AnswerError with one sentence."""
    try:
        return fn(*args)
    except AnswerError:
        raise
    except Exception as err:  # the reader's bug, reported, not re-raised as is
        text = re.sub(r"^\[[^\]]*\] ", "", str(err))  # gloo's [file.cc:78] prefix
        if re.search(r"timed out", text, flags=re.IGNORECASE):
            raise AnswerError(f"{what} waited too long: {text} ({_HANG})") from None
        if re.search(r"closed by peer|reset by peer", text):
            gone = "waited for a rank that had already finished or failed"
            raise AnswerError(f"{what} {gone} ({_HANG})") from None
        raise AnswerError(f"{what} raised {type(err).__name__}: {text}") from None


def as_number(answer: Any) -> tuple[float | None, Problem]:
    """(the answer as a float, None), or (None, what is wrong with it)."""
    if isinstance(answer, bool) or not isinstance(answer, numbers.Real):
        if isinstance(answer, torch.Tensor) and answer.numel() == 1:
            answer = answer.item()
        else:
            kind = type(answer).__name__
            return None, f"expected a number, got {kind} {answer!r:.60}"
    value = float(answer)
    if not math.isfinite(value):
        return None, f"expected a finite number, got {value}"
    return value, None


def check_number(
    name: str, answer: Any, expected: float, *, hint: str, rel: float = 1e-6
) -> bool:
    """A number against `expected`, within relative tolerance `rel`."""
    if answer is None:
        return not_answered(name, hint)
    value, problem = as_number(answer)
    if problem is None and not math.isclose(value, expected, rel_tol=rel, abs_tol=0):
        side = "too large" if value > expected else "too small"
        problem = f"{answer!r} is {side}"
    return say(name, problem, hint)


def check_answer(
    name: str, answer: Any, judge: Callable[[Any], Problem], *, hint: str
) -> bool:
    """Any in-process answer: `judge(answer)` says what is wrong (None: nothing)."""
    if answer is None:
        return not_answered(name, hint)
    try:
        with time_limit(IN_PROCESS_LIMIT):
            problem = judge(answer)
    except AnswerError as err:
        problem = str(err)
    return say(name, problem, hint)


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """AnswerError if the block runs longer than `seconds` (an answer that loops).

    SIGALRM interrupts the main thread only; elsewhere the block runs unlimited."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(*_: object) -> None:
        raise AnswerError(f"your answer ran longer than {seconds:g} s (a loop?)")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def check_on_ranks(
    name: str,
    answer: Any,
    probe: Callable[[Any], Problem],
    world_size: int,
    *,
    hint: str,
    timeout: float = COLLECTIVE_TIMEOUT,
    limit: float = RUN_LIMIT,
    form: Callable[[Any], Problem] | None = None,
) -> bool:
    """Run `probe(answer)` on `world_size` gloo ranks; PASS when no rank objects.

    `probe` must be importable (a module-level function of a chapter module) and
    call the answer through `call`. The run ends within `limit` seconds and each
    collective within `timeout`: a rank that waits for a message never sent is
    reported as such, and no rank outlives the check. `form(answer)` says what is
    wrong with the answer's type before any rank starts (default: `a_function`).
    """
    if answer is None:
        return not_answered(name, hint)
    problem = (form or a_function)(answer)
    if problem is None:
        problem = _run(probe, answer, world_size, timeout, limit)
    return say(name, problem, hint)


def a_function(answer: Any) -> Problem:
    """The form most answers on ranks take: anything callable."""
    if callable(answer):
        return None
    return f"expected a function, got {type(answer).__name__} {answer!r:.60}"


def functions(count: int) -> Callable[[Any], Problem]:
    """The form of an answer that is a tuple of `count` functions, e.g. (f, g)."""

    def form(answer: Any) -> Problem:
        if not isinstance(answer, tuple | list) or len(answer) != count:
            return f"expected a tuple of {count} functions, got {answer!r:.60}"
        return next(filter(None, map(a_function, answer)), None)

    return form


def _run(
    probe: Callable, answer: Any, world: int, timeout: float, limit: float
) -> Problem:
    """What is wrong, from the first rank that objects, a rank's error or a hang."""
    try:
        problems = spawn(probe, world, answer, timeout=timeout, deadline=limit)
    except TimeoutError:
        return f"the ranks did not finish within {limit:g} s ({_HANG})"
    except RankError as err:
        return _from_rank_error(err, timeout)
    except Exception as err:  # e.g. an answer that cannot travel to the ranks
        return f"your answer could not be run on ranks: {type(err).__name__}: {err}"
    for rank, problem in enumerate(problems):
        if problem is not None:
            return f"rank {rank}: {problem}"
    return None


def _from_rank_error(err: RankError, timeout: float) -> str:
    """One sentence from a RankError: the reader's exception, a timeout, a death."""
    text = str(err)
    found = re.search(r"AnswerError: (.*)", text)
    if found:
        return f"rank {err.rank}: {found.group(1)}"
    if re.search(r"timed? ?out|closed by peer|reset by peer", text, flags=re.I):
        return f"rank {err.rank} waited more than {timeout:g} s ({_HANG})"
    first = text.splitlines()[0] if text else type(err).__name__
    return f"{first} (a crash or an exit inside your code?)"


def compare(got: Any, want: torch.Tensor, what: str, atol: float = 1e-5) -> Problem:
    """What is wrong with tensor `got` against `want`: type, shape, then values."""
    if not isinstance(got, torch.Tensor):
        return f"{what} should be a tensor, got {type(got).__name__}"
    if tuple(got.shape) != tuple(want.shape):
        return f"{what} has shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    gap = (
        (got.detach().double() - want.double()).abs().max().item() if got.numel() else 0
    )
    if not gap <= atol:  # also catches NaN
        return f"{what} is off by up to {gap:.3g} (tolerance {atol:g})"
    return None


def plain(value: Any) -> Any:
    """A table entry as compared: strings without spaces, upper case ('s(0)' is
    'S(0)'); sequences element by element; anything else as it is."""
    if isinstance(value, str):
        return value.replace(" ", "").upper()
    if isinstance(value, tuple | list):
        return tuple(plain(v) for v in value)
    return value


def check_table(name: str, answer: Any, expected: dict, *, hint: str) -> bool:
    """A dict answer: every key of `expected`, each value equal after `plain`."""

    def judge(got: Any) -> Problem:
        if not isinstance(got, dict):
            kind = type(got).__name__
            return f"expected a dict with keys {list(expected)}, got {kind}"
        for key, want in expected.items():
            if key not in got:
                return f"no entry for {key!r}"
            if plain(got[key]) != plain(want):
                return f"the entry for {key!r}, {got[key]!r}, is not right"
        return None

    return check_answer(name, answer, judge, hint=hint)


def check_per_rank(
    name: str, answer: Any, expected: list, *, what: str, hint: str
) -> bool:
    """A list with one entry per rank (a piece's shape, a shard's rows): as many
    entries as `expected`, each equal to its entry after `plain`; the first rank
    whose entry differs is named. `what` names the entries, e.g. 'shapes'."""

    def judge(got: Any) -> Problem:
        if not isinstance(got, list | tuple) or len(got) != len(expected):
            return f"expected a list of {len(expected)} {what}, one per rank"
        for rank, (mine, want) in enumerate(zip(got, expected, strict=True)):
            if plain(mine) != plain(want):
                return f"the entry for rank {rank}, {mine!r}, is not right"
        return None

    return check_answer(name, answer, judge, hint=hint)


def check_returns(
    name: str, answer: Any, args: tuple, expected: dict[str, torch.Tensor], *, hint: str
) -> bool:
    """A function answer run here: `answer(*args)` returns a tuple of tensors, one
    for each entry of `expected` in its order, each compared under its key."""

    def judge(fn: Any) -> Problem:
        got = call(fn, *args)
        names, kind = ", ".join(expected), "a pair" if len(expected) == 2 else "a tuple"
        if not isinstance(got, tuple) or len(got) != len(expected):
            return f"expected {kind} ({names}), got {type(got).__name__}"
        found = map(compare, got, expected.values(), expected)
        return next(filter(None, found), None)

    return check_answer(name, answer, judge, hint=hint)
