"""The root conftest.py's order: the longest files it names start first."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _conftest():  # noqa: ANN202 (a module object)
    spec = importlib.util.spec_from_file_location("root_conftest", ROOT / "conftest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_file_named_first_exists_once() -> None:
    first = _conftest().FIRST
    assert len(set(first)) == len(first)
    assert [name for name in first if not (ROOT / name).is_file()] == []


def test_this_run_collected_the_named_files_first(request) -> None:  # noqa: ANN001
    """This session's own items: a file FIRST names never follows one it does not."""
    first = set(_conftest().FIRST)
    files = [item.path.relative_to(ROOT).as_posix() for item in request.session.items]
    named = [name in first for name in dict.fromkeys(files)]
    assert named == sorted(named, reverse=True)
