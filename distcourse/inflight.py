"""Which rank returned while the others waited, and in which collective they waited.

A rank that skips a collective the others make does not crash: it runs on, returns
from its function and leaves. The others then fail in that collective, and what they
see names no one: gloo's "Connection closed by peer ... typically caused by a remote
worker crashing", NCCL's timeout. This module says what happened instead:

- `mark_returned()`, called as a rank leaves (`runtime.shutdown`), writes to the
  default group's store that this rank returned, with the last collective it made on
  each group it used (their sequence numbers, from torch's flight recorder);
- `explain(error)`, called where a rank's failure is reported (`launch.spawn`), reads
  this rank's flight recorder for the collective it was in (op, group, sequence
  number) and the store for a member of that group that returned first, and says so:
  "rank 0 waited in all_reduce, collective #3 on group [0, 1], but rank 1 had
  returned from its function after #2: rank 1 skipped a collective the others
  made".

torch's flight recorder is on by default (TORCH_FR_BUFFER_SIZE entries, one per
collective, every backend: gloo, NCCL and the emulated box's inner gloo group), and
it sees what Python never calls: DDP's bucket all-reduces, DTensor's collectives. On
gloo and on the emulated box the waiting rank fails as soon as the other's connections
close, so the error comes at once; NCCL notices nothing until the collective's timeout
(the group's, 30 s by default in `runtime`), and then says the same. The recorder and
the group lookup are torch internals (`_dump_fr_trace`, `_resolve_process_group`):
where they are missing, `explain` says less, never something wrong.
"""

from __future__ import annotations

import json
import pickle
from typing import Any

import torch
import torch.distributed as dist

KEY = "distcourse/returned/"  # + the global rank: what it left in the store
# what a collective says when a peer is gone: gloo's closed or reset connection,
# NCCL's watchdog timing the collective out, a store or network error
PEER_GONE = (
    "closed by peer",
    "Connection reset",
    "timed out",
    "Timed out",
    "timing out",
)


def _entries() -> list[dict[str, Any]]:
    """This process's flight recorder entries, oldest first ([] where unavailable)."""
    dump = getattr(torch._C._distributed_c10d, "_dump_fr_trace", None)
    if dump is None:
        return []
    try:
        trace = pickle.loads(
            dump(includeCollectives=True, includeStackTraces=False, onlyActive=False)
        )
    except (RuntimeError, pickle.UnpicklingError):
        return []
    return sorted(trace.get("entries", []), key=lambda e: e.get("record_id", 0))


def _group(entry: dict[str, Any]) -> str:
    """The group's name as c10d knows it ('0' for the default group)."""
    return str(entry.get("process_group", ("?",))[0])


def _store() -> dist.Store | None:
    try:
        return dist.distributed_c10d._get_default_store()
    except (RuntimeError, ValueError, AttributeError):
        return None


def mark_returned() -> None:
    """Note in the default group's store that this rank returned, and the sequence
    number of the last collective it made on each group. Call it before the group
    is destroyed; nothing happens without one."""
    store = _store()
    if not dist.is_initialized() or store is None:
        return
    last: dict[str, int] = {}
    for entry in _entries():
        if not entry.get("is_p2p"):
            last[_group(entry)] = int(entry.get("collective_seq_id", 0))
    try:
        store.set(f"{KEY}{dist.get_rank()}", json.dumps(last))
    except (RuntimeError, dist.DistStoreError):
        pass  # a store that is gone already: the error says less, nothing wrong


def _returned(ranks: list[int]) -> dict[int, dict[str, int]]:
    """Of `ranks`, those that marked themselves returned, with their last sequence
    numbers by group."""
    store, found = _store(), {}
    if store is None:
        return found
    for rank in ranks:
        try:
            if store.check([f"{KEY}{rank}"]):
                found[rank] = json.loads(store.get(f"{KEY}{rank}"))
        except (RuntimeError, dist.DistStoreError, ValueError):
            continue
    return found


def _ranks(name: str) -> list[int]:
    """The global ranks of the group c10d calls `name` (the world where unknown)."""
    resolve = getattr(dist.distributed_c10d, "_resolve_process_group", None)
    try:
        return dist.get_process_group_ranks(resolve(name))
    except (RuntimeError, ValueError, TypeError, KeyError):
        return list(range(dist.get_world_size()))


def waiting_in() -> dict[str, Any] | None:
    """The collective this rank was in: the last one it entered that has not been
    seen completing (NCCL records that; gloo records entries only, so the last)."""
    entries = [e for e in _entries() if not e.get("is_p2p")]
    pending = [e for e in entries if e.get("state") != "completed"]
    return (pending or entries or [None])[-1]


def explain(error: BaseException) -> str | None:
    """Why a collective failed on this rank, where a member of its group returned
    before it: the rank that returned and the collective this one waited in (op,
    group, sequence number). None for any other failure."""
    backend = isinstance(error, dist.DistBackendError | dist.DistNetworkError)
    if not dist.is_initialized():
        return None
    if not backend and not any(w in str(error) for w in PEER_GONE):
        return None
    entry = waiting_in()
    if entry is None:
        return None
    name, me = _group(entry), dist.get_rank()
    ranks = _ranks(name)
    gone = _returned([r for r in ranks if r != me])
    if not gone:
        return None
    op = str(entry.get("profiling_name", "a collective")).split(":")[-1]
    seq = int(entry.get("collective_seq_id", 0))
    said = []
    for rank, last in sorted(gone.items()):
        before = last.get(name)
        after = f"after #{before}" if before else "without using that group"
        said.append(f"rank {rank} had returned from its function {after}")
    who = ", ".join(str(r) for r in sorted(gone))
    return (
        f"rank {me} waited in {op}, collective #{seq} on group {ranks}, but "
        f"{'; '.join(said)}: rank{'s' if len(gone) > 1 else ''} {who} skipped a "
        "collective the others made"
    )
