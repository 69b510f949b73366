"""A lab's machinery: run a program on ranks with the reader's function, collect how
each rank ended.

`lab.run()` runs the program with its bug and returns a Report: how it ended (a hang
turned into an error, a crash, or a silent difference from one process), which ranks,
and what each was doing (its last calls, from a FlightRecorder). `lab.check(fix)` runs
the same program with the reader's function instead and says PASS when every rank
matches one process, FAIL with the reason and a hint when not.

Every run has a finite time limit: collectives time out after `timeout` seconds, the
whole run ends within `deadline(timeout)`, and spawn leaves no process behind. What
the reader's function does wrong (raises, returns the wrong type, loops forever) is
reported in a sentence, never as a traceback from inside the package.
"""

from __future__ import annotations

import inspect
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import cloudpickle
import torch.distributed as dist

from distcourse.comm.recorder import Entry, FlightRecorder, read_entries
from distcourse.labs import report
from distcourse.launch.spawn import spawn
from distcourse.runtime import RankError

Fix = Callable[..., Any]  # the reader's function, as a program calls it
DEFAULT_TIMEOUT = 3.0  # seconds a collective may wait before it fails


def deadline(timeout: float) -> float:
    """The most seconds a run may take, start to end: a hang times out well before."""
    return 3 * timeout + 8


class ReaderError(Exception):
    """Something the reader's function did: raised, or returned the wrong thing."""


class ReaderFunction:
    """The reader's function as a program calls it: its own exceptions become
    ReaderError (a sentence, no traceback); a collective failing inside it does not
    (the recorder shows it was waiting in that call)."""

    def __init__(self, fn: Callable[..., Any], recorder: FlightRecorder) -> None:
        self.fn = fn
        self.recorder = recorder
        self.name = getattr(fn, "__name__", "your function")

    def __call__(self, *args: Any) -> Any:
        try:
            return self.fn(*args)
        except Exception as err:
            if self.recorder.waiting() is not None:
                raise  # a collective inside the function failed: a comm failure
            first = str(err).strip().splitlines()[0] if str(err).strip() else ""
            raise ReaderError(
                f"{self.name}() raised {type(err).__name__}: {first}"
            ) from None


def expect(value: Any, kind: type | tuple[type, ...], what: str) -> Any:
    """`value` if it is a `kind`, else ReaderError naming what was expected."""
    if not isinstance(value, kind):
        names = kind if isinstance(kind, tuple) else (kind,)
        wanted = " or ".join(k.__name__ for k in names)
        raise ReaderError(f"{what} should be a {wanted}, got {type(value).__name__}")
    return value


def _on_rank(program: Callable[..., Any], fn: Callable, folder: str) -> dict:
    """Body of one rank: run `program` with the reader's `fn` under a recorder.

    Never raises: how the rank ended is returned and noted in its record file (a
    rank that aborts leaves the file alone). Its own stdout/stderr go to /dev/null,
    so gloo's abort message does not reach the notebook."""
    rank, world = dist.get_rank(), dist.get_world_size()
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    path = os.path.join(folder, f"rank{rank}.jsonl")
    with FlightRecorder(path) as recorder:
        try:
            out = program(ReaderFunction(fn, recorder), rank, world)
            ending = {"status": "finished", "out": out}
        except ReaderError as err:
            ending = {"status": "reader", "message": str(err)}
        except Exception as err:  # a collective that failed, or torch's own error
            waiting = recorder.waiting()
            status = "comm" if waiting is not None else "error"
            ending = {"status": status, "message": report.first_sentence(err)}
        recorder.note(status=ending["status"])
    return ending


@dataclass
class Outcome:
    """What a run left: each rank's ending (None where it died or was stopped), the
    entries each rank recorded, the rank that died (if one did), and its seconds."""

    world: int
    endings: list[dict | None]
    entries: list[list[Entry]]
    statuses: list[str]
    died: int | None = None
    overran: bool = False
    seconds: float = 0.0

    def messages(self, status: str) -> dict[str, list[int]]:
        """Each distinct message of ranks that ended with `status`, and those ranks."""
        found: dict[str, list[int]] = {}
        for rank, ending in enumerate(self.endings):
            if ending is not None and ending["status"] == status:
                found.setdefault(ending["message"], []).append(rank)
        return found


def execute(
    program: Callable,
    fn: Callable,
    world: int,
    timeout: float,
    limit: float | None = None,
) -> Outcome:
    """Run `program` with `fn` on `world` spawned ranks; collect how each ended.
    The run ends within `limit` seconds (default: `deadline(timeout)`). Ranks are
    gloo CPU ranks, on a GPU box too: the bugs are in the order and shapes of the
    calls, not in the device, and gloo is the backend that checks sizes."""
    endings: list[dict | None] = [None] * world
    died, overran = None, False
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="distcourse-lab-") as folder:
        try:
            endings = list(
                spawn(
                    _on_rank,
                    world,
                    program,
                    fn,
                    folder,
                    backend="gloo",
                    timeout=timeout,
                    deadline=deadline(timeout) if limit is None else limit,
                )
            )
        except TimeoutError:
            overran = True
        except RankError as err:  # a rank died (gloo aborts on a size mismatch)
            died = err.rank
        seconds = time.monotonic() - start
        records = [
            read_entries(os.path.join(folder, f"rank{r}.jsonl")) for r in range(world)
        ]
    statuses = []
    for rank, (_, facts) in enumerate(records):
        status = facts.get("status")
        statuses.append(status or ("died" if rank == died else "stopped"))
    entries = [found for found, _ in records]
    return Outcome(world, endings, entries, statuses, died, overran, seconds)


def check_function(fn: Any, signature: str) -> None:
    """A clear TypeError before any rank starts if `fn` cannot be called as the lab
    will call it (`signature`, e.g. 'log_loss(loss, rank, world) -> float'), or
    if it cannot travel to the ranks (cloudpickle: a lock or a socket it holds)."""
    params = signature.split("(", 1)[1].split(")", 1)[0]
    names = [p.strip() for p in params.split(",") if p.strip()]
    if not callable(fn):
        raise TypeError(
            f"check() takes a function `def {signature}`, got {type(fn).__name__}"
        )
    try:
        inspect.signature(fn).bind(*names)
    except TypeError:
        raise TypeError(
            f"your function cannot be called with {len(names)} arguments "
            f"({', '.join(names)}); write it as `def {signature}`"
        ) from None
    except ValueError:  # a builtin without a signature: let the run say
        pass
    try:
        cloudpickle.dumps(fn)
    except Exception as err:  # what cannot travel to a rank
        raise TypeError(
            f"your function cannot be sent to the ranks ({type(err).__name__}: "
            f"{report.first_sentence(err)}): define it at the top level of a cell, "
            "using only what can be pickled"
        ) from None
