"""What every benchmark's command line shares: options, table, report.

Not a benchmark itself (`python -m distcourse.bench` lists only the others). A
benchmark builds its parser with `parser` (`sized` adds --ranks and --steps), looks
up ratios with `ratio_of`, and ends with `report`: one JSON object for `--json`,
otherwise its own text lines (`Comparison` does all of that for a benchmark that
times implementations against a reference at each world size). On the ranks,
`time_rounds` times the implementations back to back; `over_worlds` runs that at
each world size and `rows` turns the times into table rows with ratios against the
reference measured in the same rounds.
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch
import torch.distributed as dist

from distcourse import runtime, tables
from distcourse.clock import DeviceTimer
from distcourse.launch import spawn


@dataclass(frozen=True)
class MLPConfig:
    """An MLP benchmark's model size, per-rank batch, and how many steps to time
    (`bench ddp` and `bench zero`)."""

    width: int
    depth: int
    d_in: int
    batch: int
    warmup: int
    steps: int
    worlds: tuple[int, ...] = (2, 4)


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
    cells = [
        (r["ranks"], r["implementation"], f"{r['step_ms']:.2f}", f"{r['vs_torch']:.2f}")
        for r in rows
    ]
    return tables.aligned(
        [("ranks", "implementation", "step ms", vs), *cells],
        widths=(5, implementation_width, 9, max(len(vs), 8)),
        align="><>>",
        gaps=(2, 1, 2),
    )


def report(result: dict, as_json: bool, text: Callable[[], list[str]]) -> int:
    """Print `result` as one JSON object, or the lines `text()` makes; exit code 0."""
    print(json.dumps(result) if as_json else "\n".join(text()))
    return 0


@dataclass(frozen=True)
class Comparison:
    """A benchmark that times `implementations` at each world size of its config
    (`over_worlds`), each against the first in the same rounds (`vs_torch`: they ran
    back to back, so slow drifts in load cancel out), and reports on the last world
    size: its parser, its table, its JSON object and its text.

    `ratios` names, for each implementation after the first, the JSON key of its
    ratio there; `width` and `vs` are the table's implementation column width and
    ratio header (`table`).
    """

    name: str  # python -m distcourse.bench NAME
    implementations: tuple[str, ...]
    ratios: tuple[str, ...]
    width: int
    vs: str

    def parser(self, description: str, quick: str) -> argparse.ArgumentParser:
        """`parser` for this benchmark."""
        return parser(self.name, description, quick)

    def run(
        self,
        measure: Callable[..., Sequence],
        cfg: Any,
        *args: object,
        deadline: float = 600,
    ) -> list[dict]:
        """`measure(cfg, *args)` on the ranks of each of `cfg.worlds`: one row per
        (ranks, implementation), `vs_torch` against the first (`over_worlds`)."""
        names = self.implementations
        return over_worlds(measure, cfg.worlds, names, 0, cfg, *args, deadline=deadline)

    def table(self, rows: Sequence[dict]) -> str:
        """The rows as an aligned text table."""
        return table(rows, self.width, self.vs)

    def report(
        self,
        args: argparse.Namespace,
        cfg: Any,
        rows: list[dict],
        text: tuple[str, str],
        **fields: object,
    ) -> int:
        """Print the result (`report`): as JSON, the benchmark's name, the `ratios`
        on the last world size, `fields`, the config and the rows; as text, `text`'s
        model line, the table, and its verdict, a template formatted with those
        ratios and `ranks` (the last world size)."""
        ranks = cfg.worlds[-1]
        keyed = zip(self.ratios, self.implementations[1:], strict=True)
        found = {key: ratio_of(rows, name, ranks) for key, name in keyed}
        result = dict(
            benchmark=self.name, **found, **fields, config=asdict(cfg), table=rows
        )
        model, verdict = text
        lines = [model, self.table(rows), verdict.format(ranks=ranks, **found)]
        return report(result, args.json, lambda: lines)


def time_rounds(
    steps: Sequence[Callable[[], object]], warmup: int, count: int
) -> list[list[float]]:
    """On every rank: seconds per step, [implementation][step], the slowest rank's.

    Each round runs every step once, in an order that rotates through all orders, so
    none always runs first (warm caches) or last; a barrier starts each step.
    """
    orders = list(itertools.permutations(range(len(steps))))
    times = torch.zeros(len(steps), count, dtype=torch.float64)
    timer = DeviceTimer()  # device time: a GPU runs the step after it is queued
    for i in range(warmup + count):
        for k in orders[i % len(orders)]:
            dist.barrier()
            start = timer.stamp()
            steps[k]()
            if i >= warmup:
                times[k, i - warmup] = timer.seconds(start, timer.stamp())
    return slowest(times).tolist()


def slowest(times: torch.Tensor) -> torch.Tensor:
    """`times` (seconds, kept on the host while timing) maxed over the ranks: a step
    lasts as its slowest rank. Reduced on the rank's device (NCCL takes only GPU
    tensors), returned on the host."""
    on_device = times.to(runtime.device())
    dist.all_reduce(on_device, op=dist.ReduceOp.MAX)
    return on_device.cpu()


def over_worlds(
    measure: Callable[..., Sequence],
    worlds: Sequence[int],
    names: Sequence[str],
    reference: int,
    *args: object,
    deadline: float = 600,
) -> list[dict]:
    """`measure(*args)` on each world size's ranks (rank 0's times, [implementation]
    [step]); its table rows, implementation `names[reference]` the reference."""
    found = []
    for world in worlds:
        times = spawn(measure, world, *args, deadline=deadline)[0]
        found += rows(world, names, times, reference)
    return found


def sized(
    parsed: argparse.ArgumentParser,
    argv: list[str],
    configs: tuple[Any, Any],
    unit: Callable[[Any], int],
    what: str,
) -> tuple[Any, argparse.Namespace]:
    """Parse `argv` with `--ranks` and `--steps` too: the config (`configs`' first
    with --quick, else its second), with the world sizes of --ranks, each dividing
    `unit(config)` (`what` says what it is, "{unit}" standing for the number), and
    the step count of --steps."""
    parsed.add_argument("--ranks", type=int, nargs="+", help="world sizes (default 4)")
    parsed.add_argument("--steps", type=int, help="timed steps per implementation")
    args = parsed.parse_args(argv)
    cfg = configs[0] if args.quick else configs[1]
    if args.ranks:
        if any(n < 1 or unit(cfg) % n for n in args.ranks):
            parsed.error(f"each --ranks must divide {what.format(unit=unit(cfg))}")
        cfg = replace(cfg, worlds=tuple(args.ranks))
    if args.steps:
        cfg = replace(cfg, steps=args.steps)
    return cfg, args


def rows(world: int, names: Sequence[str], times: Sequence, reference: int) -> list:
    """One table row per implementation: median step time, and `vs_torch`, the median
    over rounds of (its time / the reference's in the same round): they ran back to
    back, so slow drifts in load cancel out."""
    measured = torch.tensor(times)  # [implementation, step], seconds
    base = measured[reference]
    return [
        dict(
            ranks=world,
            implementation=name,
            step_ms=round(1000 * mine.median().item(), 3),
            vs_torch=round((mine / base).median().item(), 3),
        )
        for name, mine in zip(names, measured, strict=True)
    ]
