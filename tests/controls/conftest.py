"""The negative controls' fixture: `flips(fault)` checks every verdict the test's
`pytest.mark.controls` markers name against the module's `ran` fixture (harness.py).
"""

from __future__ import annotations

from collections.abc import Callable

import harness
import pytest


@pytest.fixture
def flips(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """`flips(fault)`: each marked verdict passes as written and fails under it."""
    ran = request.getfixturevalue("ran")
    return lambda fault: harness.check(ran, fault, request.node)
