"""The negative controls' fixtures (harness.py): `ran`, a control module's CHAPTER
run with its FAULTS (once per module), which the tests of its `harness.Controls`
table check, and `stored_flips`, for controls judged on a stored run.
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
def stored_flips(request: pytest.FixtureRequest) -> Callable[..., list[str]]:
    """`stored_flips(verdicts, name, data, *plants)`: each marked verdict, judged on
    a stored run, fails on the planted data (or on the data with the plants set, and
    passes without), and passes on the book's stored run (if any) but fails on it
    marked as measured under load."""
    return lambda *args: harness.check_stored(request.node, *args)
