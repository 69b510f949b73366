"""The GPU suite's collection: a `world` argument per world size the box allows, and
every test here skipped where there is no CUDA device and no DISTCOURSE_GPU_SUITE_DEVICE
(so `make unit` on a CPU machine reports them skipped and spends no time on them)."""

from __future__ import annotations

from pathlib import Path

import gpu_suite
import pytest

HERE = Path(__file__).parent


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "world" in metafunc.fixturenames:
        sizes = gpu_suite.world_sizes() or [1]  # skipped below when empty
        metafunc.parametrize("world", sizes, ids=[f"world{w}" for w in sizes])


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    reason = gpu_suite.skip_reason()
    if reason is None:
        return
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.skip(reason=reason))
