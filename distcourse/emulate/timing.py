"""Device timing under the emulation: a work completes, seen from the host, at enqueue.

On a GPU a collective (and any kernel) is enqueued on a stream and the host moves on.
torch's docs of `Work.get_future`: for NCCL "the returned Future object ... will be
marked as completed when the work is synchronized with the current stream" -- not
when the GPU has finished it -- so a `.then()` callback runs at enqueue, and a host
clock read after a collective, with no `torch.cuda.synchronize()` or CUDA events in
between, measures enqueueing (CUDA semantics notes, "Asynchronous execution": use
`torch.cuda.Event(enable_timing=True)` or synchronize before timing).

The emulation runs every op before it returns, so a wrong timing would look right
here. Instead it keeps a count of device work enqueued since the last
synchronization (`note_device_work`, called by the emulated NCCL backend for every
op and by the emulated device for every kernel: compute is pending work too), and
the package's one clock, `clock()`, refuses to be read while that count is not
zero: RULE_TIMING, naming the op left pending and the rank. A read inside a
future's callback is the same fault (the callback runs at enqueue): it is raised
there and again at the next `synchronize()`, since torch keeps a callback's error in
the future the callback returns. `synchronize()` (the emulated
`torch.cuda.synchronize()`) clears the count, as does a host synchronization
(`.item()`, `.cpu()`: CUDA waits for the device there).
"""

from __future__ import annotations

import threading
import time

RULE_TIMING = "timing rule: a device work completes, seen from the host, at enqueue"

_lock = threading.Lock()
_state: dict = {"pending": 0, "last": "", "rank": None, "fault": None}


class TimingRuleError(RuntimeError):
    """A host clock was read while emulated device work was enqueued, unsynchronized."""


def note_device_work(what: str, rank: int | None = None) -> None:
    """Count one op enqueued on this process's emulated device (`what` names it)."""
    with _lock:
        _state["pending"] += 1
        _state["last"] = what
        _state["rank"] = rank


def pending_device_work() -> int:
    """How many ops were enqueued since the last synchronization."""
    return _state["pending"]


def synchronize(where: str = "synchronize()") -> None:
    """Wait for the emulated device: clear the pending count (every op already ran).
    A timing fault seen earlier (a clock read in a future's callback) is raised here."""
    with _lock:
        _state["pending"] = 0
        fault, _state["fault"] = _state["fault"], None
    if fault is not None:
        raise TimingRuleError(f"{fault} (reported at {where})")


def host_synced(where: str = "") -> None:
    """A host synchronization (`.item()`, `.cpu()`): the device drained, as on CUDA."""
    with _lock:
        _state["pending"] = 0


def clock() -> float:
    """The package's host clock for device timing (`time.perf_counter()`), refused
    while device work is pending: synchronize first, or use device events."""
    with _lock:
        pending, last, rank = _state["pending"], _state["last"], _state["rank"]
    if pending:
        where = "rank ?" if rank is None else f"rank {rank}"
        message = (
            f"{RULE_TIMING}: {where} read the host clock with {pending} device "
            f"op(s) enqueued and not synchronized (last: {last}); on a GPU this "
            "measures enqueueing, and a future's .then() callback runs at enqueue. "
            "Call synchronize() (torch.cuda.synchronize) or time with device events "
            "(torch's docs of Work.get_future; CUDA semantics, asynchronous execution)"
        )
        with _lock:
            _state["fault"] = _state["fault"] or message
        raise TimingRuleError(message)
    return time.perf_counter()
