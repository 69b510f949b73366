"""What a hung run leaves to read: torch's Flight Recorder, and each rank's stack.

- `flight_recorder()`: the skipped collective of lab 1 on 2 gloo ranks, and each
  rank's dump of torch's own Flight Recorder. In torch 2.14 ProcessGroupGloo records
  into it by default (`TORCH_FR_BUFFER_SIZE`, default 2000 entries;
  torch/csrc/distributed/c10d/FlightRecorder.hpp), and
  `torch._C._distributed_c10d._dump_fr_trace()` returns a rank's entries as a pickle.
- `stacks()`: a step where rank 0 waits in an all-reduce while rank 1 is stuck
  loading its batch; each rank arms `faulthandler.dump_traceback_later`, which
  writes its Python stack to a file while it hangs (what `py-spy dump --pid` shows
  of a live process, with no tool to install).

Lines name ranks, calls, shapes, functions and our own line numbers, never a path
outside the package, a port, a process id or a time.
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import re
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from distcourse.labs.tools import quiet
from distcourse.launch.spawn import spawn


def log_loss_on_rank_0(wait: float) -> dict:
    """Rank body: the gradients all-reduced on both ranks, the loss on rank 0 only;
    each rank's Flight Recorder dump, taken `wait / 2` s later while rank 0's call
    still waits (issued with `async_op=True`, so the dump comes before the `wait()`
    that fails): each rank first waits until its recorder counts the call that
    returned as completed (`recorded`), and rank 0's last call cannot be, before its
    timeout. Rank 1 dumps after rank 0 has."""
    quiet()
    rank = dist.get_rank()
    store = dist.distributed_c10d._get_default_store()
    dist.all_reduce(torch.zeros(5))  # devicecheck: host (the gradients; gloo)
    recorded(seconds=wait + 5)
    if rank == 1:
        store.wait(["dumped"], timedelta(seconds=3 * wait + 5))
        return pickle.loads(torch._C._distributed_c10d._dump_fr_trace())
    work = dist.all_reduce(torch.zeros(()), async_op=True)  # devicecheck: host (gloo)
    time.sleep(wait / 2)  # the call waits: rank 1 never makes it
    dump = torch._C._distributed_c10d._dump_fr_trace()
    store.set("dumped", "1")
    try:
        work.wait()
    except RuntimeError:
        pass
    return pickle.loads(dump)


def recorded(seconds: float) -> None:
    """Return once this rank's Flight Recorder marks every call it recorded as
    completed (or after `seconds`): gloo marks a call done on its own thread, after
    the caller's wait() has returned, so a dump taken at once can still say the last
    call is not done. It did in CI, with notebooks running beside this one."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        dump = pickle.loads(torch._C._distributed_c10d._dump_fr_trace())
        if all(e["retired"] for e in dump["entries"]):
            return
        time.sleep(0.01)


def _caller(frames: list[dict]) -> str:
    """The innermost frame outside torch: who made the call."""
    for frame in frames:
        if "/torch/" not in frame["filename"]:
            return frame["name"]
    return "?"


def fr_lines(dump: dict) -> list[str]:
    """One rank's Flight Recorder dump: the last call it enqueued and the last it
    completed, then each entry (sequence number, op, input shapes and dtypes,
    whether it completed, caller). The two numbers come from the entries: the
    group's counters in `pg_status` can lag them (a loaded CI run printed "last
    completed #1" beside an entry #2 marked completed); without entries (a torch
    whose gloo records none), from the counters."""
    lines = []
    seqs = [e["collective_seq_id"] for e in dump["entries"]]
    done = [e["collective_seq_id"] for e in dump["entries"] if e["retired"]]
    for status in dump["pg_status"].values():
        enqueued = max(seqs, default=status["last_enqueued_collective"])
        completed = max(done, default=status["last_completed_collective"])
        lines.append(f"last enqueued #{enqueued}, last completed #{completed}")
    if not dump["entries"]:  # torch before gloo recorded, or a buffer size of 0
        lines.append("  (no entries: this torch's gloo recorded nothing)")
    for entry in dump["entries"]:
        sizes, dtypes = entry["input_sizes"], entry["input_dtypes"]
        pairs = zip(sizes, dtypes, strict=True)
        shapes = ", ".join(f"{dtype}{list(size)}" for size, dtype in pairs)
        done = "completed" if entry["retired"] else "never completed"
        lines.append(
            f"  #{entry['collective_seq_id']} {entry['profiling_name']} {shapes} "
            f"from {_caller(entry['frames'])}: {done}".replace("  from", " from")
        )
    return lines


def flight_recorder(wait: float = 1.0) -> list[list[str]]:
    """Lab 1's skipped collective on 2 ranks: each rank's Flight Recorder, read."""
    dumps = spawn(
        log_loss_on_rank_0, 2, wait, backend="gloo", timeout=wait, deadline=3 * wait + 8
    )
    return [fr_lines(dump) for dump in dumps]


def load_batch(seconds: float) -> None:
    """A data loader waiting for a file that never comes (for `seconds`, here)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.02)


def train_step(rank: int, seconds: float) -> None:
    """Load a batch, then all-reduce the gradients: rank 1's loader is stuck."""
    if rank == 1:
        load_batch(seconds)
    dist.all_reduce(torch.zeros(5))  # devicecheck: host (the gradients; gloo)


def _stack_rank(folder: str, after: float, wait: float) -> str:
    """Rank body: arm faulthandler to dump this rank's stack after `after` s, run
    the step (the group's `wait` s timeout ends it), return what it wrote."""
    quiet()
    path = os.path.join(folder, f"rank{dist.get_rank()}.txt")
    with open(path, "w") as out:
        faulthandler.dump_traceback_later(after, file=out)
        try:
            train_step(dist.get_rank(), wait + after)
        except RuntimeError:
            pass
        finally:
            faulthandler.cancel_dump_traceback_later()
    with open(path) as written:
        return written.read()


_FRAME = re.compile(r'File "(?P<path>[^"]+)", line (?P<line>\d+) in (?P<name>\S+)')


def stack_lines(text: str) -> list[str]:
    """faulthandler's dump, trimmed: the thread running the step, its frames up to
    the step (most recent first); torch's files without their line numbers."""
    for block in text.split("\n\n"):
        frames = [m.groupdict() for m in _FRAME.finditer(block)]
        names = [f["name"] for f in frames]
        if "train_step" not in names:
            continue
        lines = []
        for frame in frames[: names.index("train_step") + 1]:
            path = frame["path"]
            if "site-packages/" in path:
                where = path.split("site-packages/", 1)[1]
            else:
                tail = path.split("distcourse/", 1)[-1]
                where = f"distcourse/{tail}:{frame['line']}"
            lines.append(f"  {frame['name']}  {where}")
        return lines
    return ["  (no stack of the step was written)"]


def stacks(after: float = 0.5, wait: float = 1.0) -> list[list[str]]:
    """Each rank's Python stack `after` s into a hung step (2 ranks, gloo)."""
    with tempfile.TemporaryDirectory(prefix="distcourse-stacks-") as folder:
        texts = spawn(
            _stack_rank,
            2,
            folder,
            after,
            wait,
            backend="gloo",
            timeout=wait,
            deadline=3 * (wait + after) + 8,
        )
    return [stack_lines(text) for text in texts]
