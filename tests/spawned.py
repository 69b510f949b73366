"""Fixtures and checks over the results of spawned ranks, that the unit test files
share (imported as `spawned`, beside `helpers`: pytest puts tests/ on the path).

- `on_ranks` / `once`: a module-scoped fixture, so that a file's tests share one
  spawn of its ranks (one per world size) instead of each spawning its own;
- `said_alike` / `assert_named` / `assert_differs` / `assert_rejected`: what the
  cases of a `helpers.disagreements` run raised, and `names_each_case`, the one
  test of a file's table of them; `rank_1_differs`: the whole error of a case
  where rank 1 built another model than rank 0;
- `refused_before_any_group`: `checks.outcomes` on a rank, and no process group made
  by any of the bad calls; `error_of` / `errors_and_sent`: the message each bad call
  raised on a rank, and how many messages the calls sent; `assert_says`: each
  bad call's error, by a file's table of the words it must contain;
- `max_diff` / `assert_within`: ranks that compare their results with one process
  (or with torch) by named max differences, all within a tolerance.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch.distributed as dist
from torch import Tensor

from distcourse.checks import outcomes
from distcourse.comm.ledger import Ledger
from distcourse.launch import spawn


def said_alike(found: list[dict], case: str) -> str:
    """The error ("Type: message") that `case` of a `disagreements` run raised, after
    checking that every rank raised the same one."""
    said = [errors[case][0] for errors in found]
    assert all(s == said[0] for s in said), said
    return said[0]


def assert_differs(found: list[dict], case: str, *words: str) -> None:
    """`case` of a `disagreements` run, where rank 1 differs from rank 0: every rank
    raised the same error, which names rank 1 and says each of `words`."""
    said = said_alike(found, case)
    assert "rank(s) [1] differ from rank 0" in said, said
    for w in words:
        assert w in said, (w, said)


def assert_named(found: list[dict], case: str, said: str | tuple[str, ...]) -> None:
    """`case` of a `disagreements` run, by a file's table of what each case says:
    a str is the whole error every rank raised; a tuple lists the words of an
    error, the same on every rank, that names rank 1 as differing from rank 0."""
    if isinstance(said, str):
        assert said_alike(found, case) == said
    else:
        assert_differs(found, case, *said)


def rank_1_differs(by: str, mine: str, theirs: str) -> str:
    """The whole error (as `said_alike` gives it) that `by` raises on every rank when
    rank 1 has `mine` where rank 0 has `theirs` (comm.agree's words)."""
    return (
        f"ValueError: {by}: rank(s) [1] differ from rank 0 (rank 1: {mine} where "
        f"rank 0 has {theirs}); every rank must build the same model with the same "
        "arguments"
    )


def names_each_case(named: dict[str, str | tuple[str, ...]]) -> Callable:
    """The test, parametrized over a file's table `named` (case -> what it says, as
    `assert_named` reads it), that each case of the file's `disagreeing` fixture
    (a `disagreements` run) raised what the table says, alike on every rank. Assign
    it to a test's name: `test_each_bad_call_is_named = names_each_case(NAMED)`."""

    @pytest.mark.parametrize("case", named)
    def test(disagreeing: list[dict], case: str) -> None:
        assert_named(disagreeing, case, named[case])

    return test


def assert_rejected(found: list[dict], case: str, by: str, *words: str) -> None:
    """`case` of a `disagreements` run, where rank 1 alone raised in `by`: rank 0
    stops saying rank 1 rejected its arguments, and rank 1's own error says each
    of `words`."""
    rank0, rank1 = (errors[case][0] for errors in found)
    assert rank0 == f"ValueError: {by}: rank(s) [1] rejected their arguments; stopping"
    for w in words:
        assert w in rank1, (w, rank1)


def refused_before_any_group(cases: dict[str, Callable[[], object]]) -> list[str]:
    """`checks.outcomes(cases)` on this rank, checking that no case made a process
    group: bad input is refused before any group or message."""
    groups = dist.distributed_c10d.get_pg_count()
    said = outcomes(cases)
    assert dist.distributed_c10d.get_pg_count() == groups  # no group made
    return said


def once(make: Callable[[], object]) -> Callable:
    """A module-scoped fixture whose value is `make()`, computed once for the file's
    tests (assign it to the fixture's name: `found = once(lambda: ...)`)."""

    @pytest.fixture(scope="module")
    def fixture() -> object:
        return make()

    return fixture


def on_ranks(fn: Callable[[], object], *worlds: int, **spawn_args: float) -> Callable:
    """A module-scoped fixture: `spawn(fn, world, **spawn_args)` for each world size
    in `worlds` (a parameter of the fixture when there are several), so that a
    file's tests share one spawn per world size (`results = on_ranks(_run, 2, 4)`)."""

    @pytest.fixture(scope="module", params=worlds if len(worlds) > 1 else None)
    def fixture(request: pytest.FixtureRequest) -> list:
        return spawn(fn, getattr(request, "param", worlds[0]), **spawn_args)

    return fixture


def error_of(call: Callable[[], object]) -> str:
    """The message of the ValueError `call` raised, or "no error"."""
    try:
        call()
    except ValueError as err:
        return str(err)
    return "no error"


def errors_and_sent(cases: dict[str, Callable[[], object]]) -> dict[str, str]:
    """Each case's `error_of` on this rank, and "sent": how many messages the cases
    sent together (as a str: "0" when each was refused before any message)."""
    with Ledger() as ledger:
        got = {name: error_of(case) for name, case in cases.items()}
    got["sent"] = str(len(ledger.records))
    return got


def assert_says(
    errors: dict[str, str], table: dict[str, str | tuple[str, ...]]
) -> None:
    """Each case of `table` raised an error (in `errors`, case -> its message) that
    contains the table's words: one str, or a tuple of several."""
    for case, words in table.items():
        for w in (words,) if isinstance(words, str) else words:
            assert w in errors[case], (case, w, errors[case])


def max_diff(a: Tensor, b: Tensor) -> float:
    """The largest absolute difference of two tensors of the same shape."""
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a - b).abs().max().item()


def assert_within(
    fn: Callable[..., dict[str, float]],
    world: int,
    *args: object,
    tol: float,
    at_least: int = 1,
) -> None:
    """Spawn `fn(*args)` on `world` ranks, each returning its max differences by name
    from a reference: at least `at_least` of them on each rank, all within `tol`."""
    for diffs in spawn(fn, world, *args, timeout=20):
        assert len(diffs) >= at_least and max(diffs.values()) <= tol, diffs
