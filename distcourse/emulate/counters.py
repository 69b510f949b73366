"""What the emulated device counts: bytes of live device storage, host syncs.

Memory: `memory_allocated()` is the bytes of the distinct host storages behind live
device tensors (a storage shared by views counts once; freed when torch frees it).
It is not CUDA's caching allocator: no blocks are kept, nothing is rounded.

Host synchronizations: every time the host waits for the device (a copy to the host,
`.item()`, `synchronize()`, an event's `synchronize()`), `count_host_sync(where)`
adds one and tells the hooks (emulated NCCL may hook it).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable

import torch

_lock = threading.Lock()
_state = {"syncs": 0, "live": 0, "peak": 0}
_storages: dict[int, int] = {}  # data_ptr of a live device storage -> its bytes
_sync_hooks: list[Callable[[str], None]] = []


def track(host: torch.Tensor) -> None:
    """Count the bytes of each distinct live storage behind device tensors."""
    try:
        storage = host.untyped_storage()
        key = storage.data_ptr()
    except RuntimeError:  # no data of its own (e.g. a storage torch freed)
        return
    if key in _storages or storage.nbytes() == 0:
        return
    with _lock:
        _storages[key] = storage.nbytes()
        _state["live"] += storage.nbytes()
        _state["peak"] = max(_state["peak"], _state["live"])
    weakref.finalize(storage, _untrack, key)


def _untrack(key: int) -> None:
    with _lock:
        _state["live"] -= _storages.pop(key, 0)


def memory_allocated() -> int:
    """Bytes of host storage now held by live device tensors (views counted once)."""
    return _state["live"]


def max_memory_allocated() -> int:
    """The most bytes `memory_allocated` has reached since the last reset."""
    return _state["peak"]


def reset_peak_memory_stats() -> None:
    """Restart `max_memory_allocated` from what is live now."""
    _state["peak"] = _state["live"]


def count_host_sync(where: str = "synchronize") -> None:
    """Record one host synchronization (and tell the hooks, e.g. emulated NCCL)."""
    _state["syncs"] += 1
    for hook in list(_sync_hooks):
        hook(where)


def add_sync_hook(hook: Callable[[str], None]) -> None:
    """Call `hook(where)` at every host synchronization (device exit or synchronize)."""
    _sync_hooks.append(hook)


def host_syncs() -> int:
    """How many host synchronizations this process made since the last reset."""
    return int(_state["syncs"])


def reset_host_syncs() -> None:
    """Start counting host synchronizations from zero."""
    _state["syncs"] = 0
