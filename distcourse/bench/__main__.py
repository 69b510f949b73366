"""`python -m distcourse.bench NAME [--json] ...`: run one benchmark."""

from __future__ import annotations

import importlib
import pkgutil
import sys

import distcourse.bench as package

NOT_BENCHMARKS = {"__main__", "common", "record"}  # this runner, shared pieces


def available() -> list[str]:
    """Names of the benchmarks in this package."""
    names = (m.name for m in pkgutil.iter_modules(package.__path__))
    return sorted(set(names) - NOT_BENCHMARKS)


def main(argv: list[str]) -> int:
    names = available()
    if not argv or argv[0] not in names:
        print(f"usage: python -m distcourse.bench {{{','.join(names)}}} [options]")
        return 2
    module = importlib.import_module(f"distcourse.bench.{argv[0]}")
    return module.main(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
