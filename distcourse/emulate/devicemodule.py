"""`torch.gpu`: the device module of the emulated accelerator.

torch finds a backend's module by its device type (`torch.get_device_module`,
`torch.distributed.device_mesh`'s `_get_device_handle`, FSDP2's and checkpointing's
device handles), so this is the part of `torch.cuda`'s API that those callers and the
book use. The emulated device runs every kernel on the host at once, in issue order:
a stream is one queue that is always drained, an event is "done" when recorded. What
stays observable is what a program may rely on: `synchronize()` (and `Event.
synchronize`) is counted as a host synchronization, and memory counts the bytes of
live device storage.

Random numbers: device kernels draw from the host's default generator, so
`torch.manual_seed` (which seeds every device: torch/random.py `_seed_custom_device`)
makes them reproducible, and `manual_seed` here reseeds that same generator. On a real
GPU box the device's numbers differ from the host's; no verdict may depend on them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import torch

from distcourse.emulate import counters, kernels
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
    _device.register(DeviceModule())
    kernels.register()


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
    """Wait for the device: nothing is pending here, but the wait is counted."""
    counters.count_host_sync("synchronize")


class Event:
    """A device event: complete when recorded (kernels ran on the host already)."""

    def __init__(self, enable_timing: bool = False, **_: Any) -> None:
        self.enable_timing = enable_timing
        self.at: float | None = None

    def record(self, stream: Any = None) -> None:
        self.at = time.perf_counter()

    def wait(self, stream: Any = None) -> None:
        """A stream waiting on an event: nothing to wait for (one in-order queue)."""

    def query(self) -> bool:
        return self.at is not None

    def synchronize(self) -> None:
        counters.count_host_sync("Event.synchronize")

    def elapsed_time(self, end: Event) -> float:
        """Milliseconds between two recorded events, as `torch.cuda.Event`."""
        if not (self.enable_timing and end.enable_timing):
            raise RuntimeError("Events must be created with enable_timing=True")
        if self.at is None or end.at is None:
            raise RuntimeError("both events must be recorded before elapsed_time")
        return (end.at - self.at) * 1000.0


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


def manual_seed(seed: int) -> None:
    """Seed device random numbers (the host's generator, see the module docstring)."""
    torch.default_generator.manual_seed(seed)


manual_seed_all = manual_seed


def get_rng_state(device: Any = None) -> torch.Tensor:
    return torch.get_rng_state()


def set_rng_state(state: torch.Tensor, device: Any = None) -> None:
    torch.set_rng_state(state)


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
