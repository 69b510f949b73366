"""Process groups, devices, seeds, and a local launcher: what every rank needs first.

One rule shapes this module: no rank may wait forever. Every process group carries a
finite timeout, every argument is checked before the first collective, and `spawn`
turns a failing child into an exception in the caller that names its rank.
"""

from __future__ import annotations

import datetime
import os
import random
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import psutil
import torch
import torch.distributed as dist

DEFAULT_TIMEOUT = 30.0  # seconds; long enough for a slow laptop, short enough to wait
_HOST = "127.0.0.1"


@dataclass(frozen=True)
class RankInfo:
    """Who this process is in the job, and where its tensors live."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device


class RankError(RuntimeError):
    """A rank failed; `rank` says which one and the message carries its traceback."""

    def __init__(self, rank: int, message: str) -> None:
        super().__init__(f"rank {rank} failed: {message}")
        self.rank = rank


_info: RankInfo | None = None


# ---------------------------------------------------------------- devices ---------


def gpu_count() -> int:
    """Number of CUDA GPUs this process can see (0 on a CPU machine)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pick_backend(
    local_rank: int, local_world_size: int, prefer: str | None = None
) -> tuple[str, torch.device]:
    """Choose (backend, device) for one rank: NCCL on its own GPU, else gloo on CPU.

    Every local rank needs a GPU of its own for NCCL. With more ranks on this host than
    GPUs, all ranks fall back to gloo on the CPU (with a warning): the decision depends
    only on the counts, so every rank makes the same one. `prefer` ("gloo"/"cpu" or
    "nccl"/"cuda"), or the environment variable DISTCOURSE_DEVICE, forces a choice.
    """
    prefer = (prefer or os.environ.get("DISTCOURSE_DEVICE") or "").lower() or None
    if prefer not in (None, "gloo", "cpu", "nccl", "cuda"):
        raise ValueError(f"unknown backend or device {prefer!r}; use 'gloo' or 'nccl'")
    if not 0 <= local_rank < local_world_size:
        raise ValueError(f"local_rank={local_rank} outside 0..{local_world_size - 1}")
    gpus = gpu_count()
    if prefer in ("gloo", "cpu"):
        return "gloo", torch.device("cpu")
    if gpus >= local_world_size:
        return "nccl", torch.device("cuda", local_rank)
    if prefer in ("nccl", "cuda"):
        raise ValueError(
            f"NCCL needs one GPU per rank: {local_world_size} ranks on this host, "
            f"{gpus} GPUs visible"
        )
    if gpus:
        warnings.warn(
            f"{local_world_size} ranks but only {gpus} GPUs: using gloo on the CPU",
            stacklevel=2,
        )
    return "gloo", torch.device("cpu")


# ---------------------------------------------------------- process groups ---------


def _check_rank(rank: int, world_size: int) -> None:
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    if not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be in 0..{world_size - 1}, got {rank!r}")


def _seconds(timeout: float) -> datetime.timedelta:
    if not timeout or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout}")
    return datetime.timedelta(seconds=timeout)


def make_store(
    rank: int,
    world_size: int,
    host: str = _HOST,
    port: int = 29500,
    timeout: float = DEFAULT_TIMEOUT,
    serve: bool | None = None,
) -> dist.TCPStore:
    """The rendezvous store: rank 0 serves it on `port`, the others connect to it.

    `serve=False` makes every rank a client, for a store served elsewhere (a kernel).
    """
    _check_rank(rank, world_size)
    if not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"port must be in 0..65535, got {port!r}")
    serve = rank == 0 if serve is None else serve
    try:
        return dist.TCPStore(
            host,
            port,
            world_size,
            is_master=serve,
            timeout=_seconds(timeout),
            wait_for_workers=False,
        )
    except (RuntimeError, OSError) as err:  # DistNetworkError is a RuntimeError
        text = str(err).lower()
        if serve and ("in use" in text or "bind" in text):
            raise RuntimeError(
                f"port {port} on {host} is already in use: pick another port, "
                "or pass port=0 to let the operating system choose one"
            ) from err
        raise TimeoutError(
            f"rank {rank} could not reach the store at {host}:{port} "
            f"within {timeout:.0f} s: is rank 0 running? ({err})"
        ) from err


def serve_store(world_size: int, timeout: float = DEFAULT_TIMEOUT) -> dist.TCPStore:
    """A rendezvous store served by this process on a port the OS picks (no race).

    The launcher (a notebook kernel, `spawn`) keeps it while its `world_size` ranks
    connect with `make_store(..., port=store.port, serve=False)`.
    """
    return dist.TCPStore(
        _HOST, 0, world_size + 1, is_master=True,
        timeout=_seconds(timeout), wait_for_workers=False,
    )  # fmt: skip


def init(
    rank: int,
    world_size: int,
    *,
    store: dist.Store | None = None,
    host: str = _HOST,
    port: int = 29500,
    backend: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    local_rank: int | None = None,
    local_world_size: int | None = None,
    threads: int | None = 1,
    debug: bool = False,
) -> RankInfo:
    """Join a process group as `rank` of `world_size`; return this rank's RankInfo.

    Pass a `store` (e.g. one served by the notebook kernel), or let rank 0 serve one on
    `host:port`. Every collective in this group fails after `timeout` seconds instead of
    waiting forever. `threads` caps intra-op threads so N CPU ranks share the cores.
    `debug=True` gives this group PyTorch's DETAIL checks (as TORCH_DISTRIBUTED_DEBUG,
    which torch reads only at import): all ranks meet at a monitored barrier before
    each collective and compare calls, so a rank that skips one is named ("Ranks 1, 2
    failed to pass monitoredBarrier") and mismatches are reported. A barrier per
    collective: for finding bugs, not for speed.
    """
    global _info
    _check_rank(rank, world_size)
    if dist.is_initialized():
        raise RuntimeError(
            "a process group is already initialised in this process: "
            "call distcourse.runtime.shutdown() first"
        )
    local_rank = rank if local_rank is None else local_rank
    local_world_size = world_size if local_world_size is None else local_world_size
    backend, device = pick_backend(local_rank, local_world_size, backend)
    if store is None:
        store = make_store(rank, world_size, host, port, timeout)
    _join(backend, device, timeout, threads, debug, store=store, rank=rank,
          world_size=world_size)  # fmt: skip
    _info = RankInfo(rank, world_size, local_rank, backend, device)
    return _info


def _join(
    backend: str, device: torch.device, timeout: float, threads: int | None,
    debug: bool, **rendezvous: Any,
) -> None:  # fmt: skip
    """Bind this rank to its device and create the default group (init's last step)."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    elif threads:
        torch.set_num_threads(threads)
    previous = dist.get_debug_level()
    if debug:  # the level is read when the group is created; restored after
        dist.set_debug_level(dist.DebugLevel.DETAIL)
    try:
        dist.init_process_group(
            backend,
            timeout=_seconds(timeout),
            device_id=device if device.type == "cuda" else None,
            **rendezvous,
        )
    finally:
        dist.set_debug_level(previous)


def init_from_env(
    timeout: float = DEFAULT_TIMEOUT, backend: str | None = None
) -> RankInfo:
    """Join the group described by torchrun's variables (RANK, WORLD_SIZE, ...)."""
    global _info
    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except KeyError as err:
        raise RuntimeError(
            f"{err} is not set: launch this script with torchrun"
        ) from err
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    backend, device = pick_backend(local_rank, local_world, backend)
    _join(backend, device, timeout, threads=1, debug=False)  # env:// rendezvous
    _info = RankInfo(rank, world, local_rank, backend, device)
    return _info


def require_initialized() -> RankInfo:
    """This rank's RankInfo; a clear error if no process group exists yet."""
    if not dist.is_initialized():
        raise RuntimeError(
            "no process group: call distcourse.runtime.init(...) (or cluster.start() "
            "in a notebook) before any collective"
        )
    if _info is None:  # initialised by someone else, e.g. plain torch code
        return RankInfo(
            dist.get_rank(), dist.get_world_size(), dist.get_rank(),
            dist.get_backend(), _device_of(dist.get_backend()),
        )  # fmt: skip
    return _info


def _device_of(backend: str) -> torch.device:
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def device() -> torch.device:
    """The device this rank's tensors should live on."""
    return require_initialized().device


def shutdown() -> None:
    """Destroy this process's process group, if any (safe to call twice)."""
    global _info
    if dist.is_initialized():
        dist.destroy_process_group()
    _info = None


# -------------------------------------------------------------------- seeds --------


def seed_everything(seed: int, per_rank: bool = True) -> int:
    """Seed Python, NumPy and torch; return the seed used.

    With `per_rank`, rank r uses seed + r: ranks draw different numbers (different data
    shards, say), and every run draws the same ones. Without it, all ranks agree (e.g.
    to build identical initial weights).
    """
    if per_rank and dist.is_initialized():
        seed = seed + dist.get_rank()
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    return seed


# ---------------------------------------------------------------- printing ---------


def print_in_order(*values: Any) -> None:
    """Print from every rank in rank order, each line prefixed with its rank.

    A collective: every rank must call it. Rank 0 prints all lines.
    """
    info = require_initialized()
    line = " ".join(str(v) for v in values)
    lines: list[str | None] = [None] * info.world_size
    dist.all_gather_object(lines, line)
    if info.rank == 0:
        for r, text in enumerate(lines):
            print(f"[rank {r}] {text}", flush=True)


# ------------------------------------------------------------------- watchdog ------


def pid_alive(pid: int) -> bool:
    """True while process `pid` runs (a zombie waiting to be reaped counts as gone)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def watch_parent(
    pid: int, interval: float = 0.5, on_exit: Callable[[], None] | None = None
) -> threading.Thread:
    """Exit this process soon after process `pid` is gone (a daemon thread polls it).

    Spawned ranks and notebook engines run one, so none outlives its test or notebook.
    """

    def loop() -> None:
        while pid_alive(pid):
            time.sleep(interval)
        if on_exit is not None:
            on_exit()
        os._exit(1)

    thread = threading.Thread(target=loop, name=f"watch-{pid}", daemon=True)
    thread.start()
    return thread


# spawn lives in its own module (it is long); it is part of this module's interface.
from distcourse.launch import spawn  # noqa: E402, F401
