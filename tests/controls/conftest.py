"""The negative controls' fixture: `flips(*faults)` checks every verdict the test's
`pytest.mark.controls` markers name against the module's `ran` fixture (harness.py).
"""

from __future__ import annotations

from collections.abc import Callable

import harness
import pytest


@pytest.fixture
def flips(request: pytest.FixtureRequest) -> Callable[..., None]:
    """`flips(*faults)`: each marked verdict passes as written and fails under one
    of the faults (usually one)."""
    ran = request.getfixturevalue("ran")
    return lambda *faults: harness.check(ran, faults, request.node)
