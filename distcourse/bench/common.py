"""What every benchmark's command line shares: options, table, report.

Not a benchmark itself (`python -m distcourse.bench` lists only the others). A
benchmark builds its parser with `parser`, looks up ratios with `ratio_of`, and ends
with `report`: one JSON object for `--json`, otherwise its own text lines.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence


def parser(name: str, description: str, quick: str) -> argparse.ArgumentParser:
    """`python -m distcourse.bench NAME` with the options every benchmark takes."""
    parsed = argparse.ArgumentParser(
        prog=f"python -m distcourse.bench {name}", description=description
    )
    parsed.add_argument("--json", action="store_true", help="print one JSON object")
    parsed.add_argument("--quick", action="store_true", help=quick)
    return parsed


def ratio_of(rows: Sequence[dict], name: str, ranks: int) -> float:
    """The `vs_torch` ratio of the row for implementation `name` on `ranks` ranks."""
    for row in rows:
        if (row["ranks"], row["implementation"]) == (ranks, name):
            return row["vs_torch"]
    raise KeyError(f"no row for {name!r} on {ranks} ranks")


def table(rows: Sequence[dict], implementation_width: int, vs: str) -> str:
    """Rows of (ranks, implementation, step_ms, vs_torch) as an aligned text table."""
    width, right = implementation_width, max(len(vs), 8)
    lines = [f"{'ranks':>5}  {'implementation':<{width}} {'step ms':>9}  {vs:>{right}}"]
    for row in rows:
        lines.append(
            f"{row['ranks']:>5}  {row['implementation']:<{width}} "
            f"{row['step_ms']:>9.2f}  {row['vs_torch']:>{right}.2f}"
        )
    return "\n".join(lines)


def report(result: dict, as_json: bool, text: Callable[[], list[str]]) -> int:
    """Print `result` as one JSON object, or the lines `text()` makes; exit code 0."""
    print(json.dumps(result) if as_json else "\n".join(text()))
    return 0
