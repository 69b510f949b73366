"""`torch.gpu`: the device module of the emulated accelerator.

torch finds a backend's module by its device type (`torch.get_device_module`,
`torch.distributed.device_mesh`'s `_get_device_handle`, FSDP2's and checkpointing's
device handles), so this is the part of `torch.cuda`'s API that those callers and the
book use. The emulated device runs every kernel on the host at once, in issue order:
a stream is one queue. What stays observable is what a program may rely on:
`synchronize()` waits for everything issued (the results held back by
`completion` are written in, the timing rule's pending work is cleared) and is
counted as a host synchronization; an event records a point of the stream, and its
`synchronize()` finishes the non-blocking copies issued before it; `elapsed_time`
needs both events complete, as CUDA's does; memory counts the bytes of live device
storage.

Random numbers: each device has its own generator, seeded apart from the host's
(`emulate.rng`): `torch.manual_seed` seeds it too (torch/random.py), and
`get_rng_state`/`set_rng_state` save and restore it, not the host's.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from collections.abc import Iterator
from typing import Any

import torch

from distcourse.emulate import completion, counters, kernels, rng, timing
from distcourse.emulate import device as _device

# torch.gpu answers these by name (DeviceModule.__getattr__ looks in globals())
from distcourse.emulate.ordinal import (  # noqa: F401
    current,
    current_device,
    device_count,
    set_device,
    set_device_count,
)


def setup() -> None:
    """Register the emulated device in this process, with `torch.gpu` as its device
    module (idempotent)."""
    if _device.enabled():
        return
    _device.register(DeviceModule())
    kernels.register()
    counters.add_sync_hook(timing.host_synced)  # the host waited for the stream:
    counters.add_sync_hook(lambda where: completion.complete_copies())  # copies done
    counters.add_sync_hook(_complete_events)  # and events recorded before are complete


def rank_device(local_rank: int, local_world_size: int) -> torch.device:
    """Set up the emulation for a rank: `local_world_size` GPUs on this host, the
    rank's own current; return its device `gpu:<local_rank>`."""
    setup()
    set_device_count(local_world_size)
    set_device(local_rank)
    return current()


class device:  # noqa: N801 (torch.cuda.device's name)
    """`with torch.gpu.device(i):` makes gpu:i current inside the block."""

    def __init__(self, index: Any) -> None:
        self.index = index if isinstance(index, int) else torch.device(index).index
        self.previous = current_device()

    def __enter__(self) -> None:
        self.previous = current_device()
        if self.index is not None and self.index >= 0:
            set_device(self.index)

    def __exit__(self, *exc: object) -> None:
        set_device(self.previous)


def synchronize(device: Any = None) -> None:
    """Wait for everything issued on the device: held-back results are written in,
    pending timing work is cleared (a timing fault seen in a callback is raised)."""
    completion.synchronize()
    counters.count_host_sync("synchronize")
    timing.synchronize()


class Event:
    """A device event: a point of the stream, complete once synchronized (or once
    the host has synced the stream)."""

    def __init__(self, enable_timing: bool = False, **_: Any) -> None:
        self.enable_timing = enable_timing
        self.at: float | None = None
        self.position = 0
        self.done = False

    def record(self, stream: Any = None) -> None:
        self.at = time.perf_counter()
        self.position = completion.position()
        self.done = False
        _recorded.add(self)

    def wait(self, stream: Any = None) -> None:
        """A stream waiting on an event: nothing to wait for (one in-order queue)."""

    def query(self) -> bool:
        return self.at is not None

    def synchronize(self) -> None:
        completion.complete_copies(self.position)
        counters.count_host_sync("Event.synchronize")
        self.done = True

    def elapsed_time(self, end: Event) -> float:
        """Milliseconds between two recorded events, as `torch.cuda.Event`: both
        must be complete (CUDA: "Both events must be completed before calculating
        elapsed time"), so synchronize first."""
        if not (self.enable_timing and end.enable_timing):
            raise RuntimeError("Events must be created with enable_timing=True")
        if self.at is None or end.at is None:
            raise RuntimeError("both events must be recorded before elapsed_time")
        if not (self.done and end.done):
            raise RuntimeError(
                "Both events must be completed before calculating elapsed time "
                "(emulated GPU: synchronize the device, the stream or the end event)"
            )
        return (end.at - self.at) * 1000.0


_recorded: weakref.WeakSet = weakref.WeakSet()  # events a sync will complete


def _complete_events(where: str = "") -> None:
    """The host waited for the stream: every event recorded so far is complete."""
    for event in list(_recorded):
        event.done = True
    _recorded.clear()


class Stream:
    """A device stream: one in-order queue that never holds work back."""

    def __init__(self, device: Any = None, priority: int = 0, **_: Any) -> None:
        self.device = torch.device(_device.DEVICE_TYPE, current_device())
        self.priority = priority

    def wait_stream(self, stream: Stream) -> None:
        """Order this stream after `stream`: already so."""

    def wait_event(self, event: Event) -> None:
        """Order this stream after `event`: already so."""

    def record_event(self, event: Event | None = None) -> Event:
        event = event or Event()
        event.record(self)
        return event

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        completion.complete_copies()
        counters.count_host_sync("Stream.synchronize")

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


_default_stream = {"stream": None}


def current_stream(device: Any = None) -> Stream:
    if _default_stream["stream"] is None:
        _default_stream["stream"] = Stream()
    return _default_stream["stream"]  # type: ignore[return-value]


default_stream = current_stream


@contextlib.contextmanager
def stream(s: Stream | None) -> Iterator[None]:
    """Run the block "on" `s`: every stream is the same in-order queue here."""
    yield


def set_stream(s: Stream) -> None:
    """Make `s` current: a no-op, as every stream is one queue."""


def _index(device: Any) -> int:
    if device is None:
        return current_device()
    if isinstance(device, int):
        return device
    return torch.device(device).index or 0


def manual_seed(seed: int) -> None:
    """Seed the current device's generator (`emulate.rng`)."""
    rng.manual_seed(seed, current_device())


def manual_seed_all(seed: int) -> None:
    """Seed every device's generator (what `torch.manual_seed` calls)."""
    for index in range(device_count()):
        rng.manual_seed(seed, index)


def initial_seed() -> int:
    return rng.initial_seed(current_device())


def get_rng_state(device: Any = None) -> torch.Tensor:
    """The device's generator state (not the host's)."""
    return rng.get_state(_index(device))


def set_rng_state(state: torch.Tensor, device: Any = None) -> None:
    rng.set_state(state, _index(device))


def get_rng_state_all() -> list[torch.Tensor]:
    return [rng.get_state(i) for i in range(device_count())]


def set_rng_state_all(states: list[torch.Tensor]) -> None:
    for index, state in enumerate(states):
        rng.set_state(state, index)


def get_amp_supported_dtype() -> list[torch.dtype]:
    """What `torch.autocast("gpu", ...)` accepts (its casts: `kernels.py`)."""
    return [torch.float16, torch.bfloat16]


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def _is_in_bad_fork() -> bool:
    return False


memory_allocated = counters.memory_allocated
max_memory_allocated = counters.max_memory_allocated
reset_peak_memory_stats = counters.reset_peak_memory_stats


def empty_cache() -> None:
    """Return cached blocks to the system: the emulation caches nothing."""


def get_device_name(device: Any = None) -> str:
    return "emulated GPU (host memory, NCCL's rules)"


class DeviceModule:
    """The object registered as `torch.gpu`: this module's functions as attributes."""

    def __getattr__(self, name: str) -> Any:
        value = globals().get(name)
        if value is None or name.startswith("__"):
            raise AttributeError(f"torch.{_device.DEVICE_TYPE} has no {name!r}")
        return value
