"""The negative controls' fixtures (harness.py): `ran`, a control module's CHAPTER
run with its FAULTS (once per module), and `flips(*faults)`, which checks every
verdict the test's `pytest.mark.controls` markers name against it.
"""

from __future__ import annotations

from collections.abc import Callable

import harness
import pytest


@pytest.fixture(scope="module")
def ran(request: pytest.FixtureRequest) -> harness.Ran:
    """The module's CHAPTER run with its FAULTS: one spawn for the whole file."""
    return request.module.CHAPTER.run(request.module.FAULTS)


@pytest.fixture
def flips(request: pytest.FixtureRequest) -> Callable[..., None]:
    """`flips(*faults)`: each marked verdict passes as written and fails under one
    of the faults (usually one)."""
    ran = request.getfixturevalue("ran")
    return lambda *faults: harness.check(ran, faults, request.node)


@pytest.fixture
def stored_flips(request: pytest.FixtureRequest) -> Callable[..., list[str]]:
    """`stored_flips(verdicts, name, data, *plants)`: each marked verdict, judged on
    a stored run, fails on the planted data (or on the data with the plants set, and
    passes without), and passes on the book's stored run (if any) but fails on it
    marked as measured under load."""
    return lambda *args: harness.check_stored(request.node, *args)
