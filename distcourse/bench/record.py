"""Benchmark runs stored with their provenance, for the chapters to judge.

A chapter's timing claim (chapter 3's all-reduces hidden behind backward, chapter 5's
pipelined split beating the naive one, chapter 2's alpha-beta model breaking where
ranks share cores) shows only where every rank has a core of its own: on a 2-core
machine, 2 ranks of one thread each, and nothing else running. A notebook run on a
reader's laptop, or beside a test suite, shares its cores with other programs, and
what it measures is the sharing. So each claim is judged on a run stored in
`book/measurements/` with where and how it was measured, and the chapter prints the
run it has just made beside it, masked, as what this machine gives now.

`Quiet` watches a run: the machine's load average before it, and the processor time
everything else on the machine took while it ran (from /proc/stat, less what this
process and its children used). `store` refuses a run above `LOAD_PER_CORE` of either,
unless told to keep it flagged (`quiet: false` in its provenance, which every verdict
reads as a failure). `load` reads a stored run back; `missing` is the line a chapter
prints where none is stored yet.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

MEASUREMENTS = Path(__file__).resolve().parents[2] / "book" / "measurements"
LOAD_PER_CORE = 0.5  # the most load average, and others' processor use, a core


class NotQuiet(RuntimeError):
    """A run measured on a busy machine was offered as a stored reference."""


def _busy_seconds() -> float | None:
    """Seconds all processors have spent running processes since boot, or None:
    user, nice, system and steal of /proc/stat (steal: another machine on the same
    host ran; interrupts are left out, as the run's own messages raise them)."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return None
    ticks = [int(v) for v in fields] + [0] * 8
    user, nice, system, steal = ticks[0], ticks[1], ticks[2], ticks[7]
    return (user + nice + system + steal) / os.sysconf("SC_CLK_TCK")


def own_seconds() -> float:
    """Processor seconds of this process and all its descendants, those alive (the
    ranks of `launch.spawn` are children of its forkserver, not of this process)
    and those ended (in their parents' counts): from /proc, or without it this
    process and its children that ended."""
    tree = _tree_ticks()
    if tree is None:
        own = resource.getrusage(resource.RUSAGE_SELF)
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
    return tree / os.sysconf("SC_CLK_TCK")


def _tree_ticks() -> int | None:
    """Clock ticks of this process and its live descendants, each with its ended
    children's (utime + stime + cutime + cstime of /proc/PID/stat), or None."""
    parent, ticks = {}, {}
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return None
    for pid in entries:
        try:
            line = Path(f"/proc/{pid}/stat").read_text()
        except OSError:  # ended meanwhile
            continue
        fields = line[line.rindex(")") + 2 :].split()
        parent[int(pid)] = int(fields[1])
        ticks[int(pid)] = sum(int(v) for v in fields[11:15])
    me, total = os.getpid(), 0
    for pid in ticks:
        up = pid
        while up > 1 and up != me:
            up = parent.get(up, 0)
        total += ticks[pid] if up == me else 0
    return total


@dataclass
class Quiet:
    """`with Quiet() as q: run()`; then `q.provenance()`: how busy the machine was.

    `others` is the processor time that did not belong to this process or its
    children, in cores, averaged over the run: 0 on an idle machine. Children must
    have ended (joined) when the block ends for their time to count as ours.
    """

    cores: int = field(default_factory=lambda: os.cpu_count() or 1)
    load_before: tuple[float, ...] = ()
    load_after: tuple[float, ...] = ()
    others: float | None = None
    seconds: float = 0.0

    def __enter__(self) -> Quiet:
        self.load_before = tuple(round(v, 2) for v in os.getloadavg())
        self._start = (time.monotonic(), _busy_seconds(), own_seconds())
        return self

    def __exit__(self, *_: object) -> None:  # an exception in the run propagates
        wall0, busy0, own0 = self._start
        self.seconds = time.monotonic() - wall0
        busy1 = _busy_seconds()
        self.load_after = tuple(round(v, 2) for v in os.getloadavg())
        if busy0 is not None and busy1 is not None and self.seconds > 0:
            theirs = (busy1 - busy0) - (own_seconds() - own0)
            self.others = round(max(theirs, 0.0) / self.seconds, 3)

    def problems(self, limit: float = LOAD_PER_CORE) -> list[str]:
        """Why this run is not quiet (an empty list: it is)."""
        found = []
        if self.load_before and self.load_before[0] > limit * self.cores:
            found.append(
                f"load average {self.load_before[0]} before the run on {self.cores} "
                f"cores (at most {limit} a core)"
            )
        if self.others is not None and self.others > limit * self.cores:
            found.append(
                f"other programs used {self.others:.2f} cores during the run "
                f"(at most {limit} a core)"
            )
        return found

    def provenance(self, **run: Any) -> dict[str, Any]:
        """Where, when and how quietly this run was measured, with `run`'s fields
        (ranks, threads per rank, command, ...)."""
        return dict(
            date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            machine=_machine(),
            cores=self.cores,
            load_average_before=list(self.load_before),
            load_average_after=list(self.load_after),
            other_programs_cores=self.others,
            quiet=not self.problems(),
            seconds=round(self.seconds, 1),
            torch=torch.__version__,
            python=platform.python_version(),
            commit=_commit(),
            **run,
        )


def _machine() -> str:
    """The processor's model and the system, e.g. 'AMD EPYC 7B13, Linux x86_64'."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {platform.system()} {platform.machine()}"


def _commit() -> str:
    """The repository's commit, with '+changes' where the tree differs, or ''."""
    head = _git("rev-parse", "--short", "HEAD")
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    return f"{head}+changes" if head and dirty else head


def _git(*args: str) -> str:
    """What `git args...` prints in the repository ('' where git is not at hand)."""
    try:
        done = subprocess.run(
            ["git", *args],
            capture_output=True,
            text=True,
            cwd=MEASUREMENTS.parents[1],
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip()


@dataclass(frozen=True)
class Stored:
    """A stored run: what it measured (`data`) and where and how (`provenance`)."""

    name: str
    data: dict[str, Any]
    provenance: dict[str, Any]

    def describe(self) -> str:
        """One line: the machine, cores, ranks, load and date of the run."""
        p = self.provenance
        load = p.get("load_average_before") or ["?"]
        others = p.get("other_programs_cores")
        busy = "" if others is None else f", others {others:.2f} cores"
        threads = p.get("threads_per_rank", "?")
        return (
            f"stored run: {p.get('cores')} cores ({p.get('machine')}), "
            f"{p.get('ranks')} ranks of {threads} thread(s), load average "
            f"{load[0]} before{busy}, torch {p.get('torch')}, "
            f"{str(p.get('date', ''))[:10]}"
            + ("" if p.get("quiet") else "; NOT QUIET: no reference")
        )


def path(name: str, root: Path = MEASUREMENTS) -> Path:
    return root / f"{name}.json"


def store(
    name: str,
    data: dict[str, Any],
    quiet: Quiet,
    *,
    keep_busy: bool = False,
    root: Path = MEASUREMENTS,
    **run: Any,
) -> Path:
    """Write `data` with `quiet`'s provenance (and `run`'s fields) as `name`.json.

    NotQuiet unless the machine was quiet; with `keep_busy` the run is written
    anyway, marked `quiet: false`, which the chapters' verdicts refuse.
    """
    problems = quiet.problems()
    if problems and not keep_busy:
        raise NotQuiet(
            f"not stored as {name}: " + "; ".join(problems) + ". Measure on a quiet "
            "machine (every rank a core of its own, nothing else running), or keep "
            "it flagged as not quiet (--keep-busy)"
        )
    record = dict(provenance=quiet.provenance(**run), data=data)
    target = path(name, root)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(record, indent=1) + "\n")
    return target


def load(name: str, root: Path = MEASUREMENTS) -> Stored | None:
    """The stored run `name`, or None where none is stored."""
    target = path(name, root)
    if not target.exists():
        return None
    record = json.loads(target.read_text())
    return Stored(name, record["data"], record["provenance"])


def missing(name: str, command: str) -> str:
    """What a chapter prints where no run is stored yet."""
    return (
        f"no stored run {name!r} yet: on a quiet machine, `{command}` measures and "
        f"stores it in book/measurements/{name}.json"
    )


def command_line() -> str:
    """This process's command line, for the provenance."""
    return " ".join([Path(sys.executable).name, *sys.argv])


def parser(name: str, stored: str) -> argparse.ArgumentParser:
    """`python -m distcourse.bench NAME` with what every stored-run benchmark takes:
    --json, --store (as `stored`.json) and --keep-busy."""
    made = argparse.ArgumentParser(prog=f"python -m distcourse.bench {name}")
    made.add_argument("--json", action="store_true", help="print one JSON object")
    made.add_argument("--store", action="store_true", help=f"write {stored}.json")
    made.add_argument("--keep-busy", action="store_true", help="store it flagged")
    return made


def configured(
    name: str, stored: str, argv: list[str], quick: str, configs: tuple[Any, Any]
) -> tuple[Any, argparse.Namespace]:
    """Parse `argv` with `parser`'s options and --quick (`quick`: its help): the
    config (`configs`' first with --quick, else its second) and the options."""
    made = parser(name, stored)
    made.add_argument("--quick", action="store_true", help=quick)
    args = made.parse_args(argv)
    return configs[0] if args.quick else configs[1], args


def measured(
    name: str,
    stored: str,
    argv: list[str],
    quick: str,
    configs: tuple[Any, Any],
    measure: Callable[[Any], Any],
) -> tuple[Any, argparse.Namespace, Any, Quiet]:
    """A stored-run benchmark's start: `configured`'s config and options, then
    `measure(config)` run under `Quiet` (what `finish` stores with the data).
    Returns (config, options, what `measure` returned, the Quiet that watched it)."""
    cfg, args = configured(name, stored, argv, quick, configs)
    with Quiet() as quiet:
        data = measure(cfg)
    return cfg, args, data, quiet


def finish(
    name: str,
    data: dict[str, Any],
    quiet: Quiet,
    show: Callable[[Stored], None],
    args: argparse.Namespace,
    **run: Any,
) -> int:
    """A benchmark's end (`args` from `parser`): print the run (one JSON object, or
    `show`), then store it as `name` if asked; a busy machine's run is refused with
    the reason on stderr and exit code 1 (it was printed all the same)."""
    run.setdefault("command", command_line())
    measured = Stored(name, data, quiet.provenance(**run))
    if args.json:
        print(json.dumps(dict(data=data, provenance=measured.provenance)))
    else:
        show(measured)
    if args.store:
        try:
            where = store(name, data, quiet, keep_busy=args.keep_busy, **run)
        except NotQuiet as refused:
            print(refused, file=sys.stderr)
            return 1
        print(f"stored {where}")
    return 0


def report(
    name: str,
    bench: str,
    stored: Stored | None,
    lines: Callable[[dict[str, Any]], list[str]],
    verdicts: Callable[[Stored], list[str]],
    live: list[str],
) -> None:
    """What a chapter prints of the stored run `name` (made by `python -m
    distcourse.bench BENCH --store`): `lines` of its data, where and how it was
    measured, its `verdicts`; where none is stored, that, how to make one, and the
    `live` run's lines alone."""
    if stored is None:
        command = f"python -m distcourse.bench {bench} --store"
        print(missing(name, command), *live, sep="\n")
        return
    print(*lines(stored.data), stored.describe(), *verdicts(stored), sep="\n")
