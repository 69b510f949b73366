"""Process groups, devices, seeds: what every rank needs first.

One rule shapes this module: no rank may wait forever. Every process group carries a
finite timeout, and every argument is checked before the first collective. Starting
ranks is `distcourse.launch`'s job; this module is what runs on each of them.
"""

from __future__ import annotations

import os
import random
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from distcourse import accelerator, emulate, inflight
from distcourse.emulate import nccl, p2p
from distcourse.rendezvous import (
    LOOPBACK,
    as_timedelta,
    check_rank,
    is_loopback,
    keep_gloo_on_loopback,
    make_store,
)

DEFAULT_TIMEOUT = 30.0  # seconds; long enough for a slow laptop, short enough to wait


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


DEVICE_VARIABLE = "DISTCOURSE_DEVICE"  # cpu | cuda | emulated: every rank's choice
EMULATED = "emulated"  # DISTCOURSE_DEVICE value: an emulated GPU per rank
# An emulated rank's default group is emulated NCCL alone, as a GPU box's is "nccl":
# a host tensor in a collective gets NCCL's refusal (`distcourse.emulate.nccl`).
EMULATED_BACKEND = f"{emulate.DEVICE_TYPE}:{nccl.BACKEND}"


def device_preference() -> str | None:
    """'cpu', 'cuda' or 'emulated' as DISTCOURSE_DEVICE asks, or None when unset.

    The test configuration sets it to 'cpu' (the stored outputs are CPU outputs, so
    the book compares equal on a GPU box too); `make test-gpu` sets 'cuda';
    'emulated' gives every rank an emulated GPU (`distcourse.emulate`). Child
    processes (engines, spawned ranks, torchrun's workers) inherit it.
    """
    value = os.environ.get(DEVICE_VARIABLE, "").strip().lower()
    if value not in ("", "cpu", "cuda", EMULATED):
        raise ValueError(
            f"{DEVICE_VARIABLE}={os.environ[DEVICE_VARIABLE]!r}: use 'cpu' or "
            f"'cuda' ({EMULATED!r}: emulated GPUs), or leave it unset to choose by "
            "the GPUs visible"
        )
    return value or None


def pick_backend(
    local_rank: int,
    local_world_size: int,
    prefer: str | None = None,
    gpus: int | None = None,
) -> tuple[str, torch.device]:
    """Choose (backend, device) for one rank: NCCL on its own GPU, else gloo on CPU.

    Every local rank needs a GPU of its own for NCCL. With more ranks on this host than
    GPUs, all ranks fall back to gloo on the CPU (with a warning): the decision depends
    only on the counts, so every rank makes the same one. `prefer` ("gloo"/"cpu" or
    "nccl"/"cuda"), or else the environment variable DISTCOURSE_DEVICE (cpu/cuda),
    forces a choice. `gpus` is the number of GPUs visible (default: gpu_count()).
    'emulated' gives every rank the emulated GPU `gpu:<local_rank>` (one per local
    rank, as NCCL needs) whatever the host has.
    """
    prefer = (prefer or "").lower() or device_preference()
    if prefer not in (None, "gloo", "cpu", "nccl", "cuda", EMULATED):
        raise ValueError(
            f"unknown backend or device {prefer!r}; use 'gloo', 'nccl' or {EMULATED!r}"
        )
    if not 0 <= local_rank < local_world_size:
        raise ValueError(f"local_rank={local_rank} outside 0..{local_world_size - 1}")
    if prefer == EMULATED:
        return EMULATED_BACKEND, emulate.rank_device(local_rank, local_world_size)
    gpus = gpu_count() if gpus is None else gpus
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


def init(
    rank: int,
    world_size: int,
    *,
    store: dist.Store | None = None,
    host: str = LOOPBACK,
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
    check_rank(rank, world_size)
    as_timedelta(timeout)  # a bad timeout is refused here, not after rank 0 listens
    if dist.is_initialized():
        raise RuntimeError(
            "a process group is already initialised in this process: "
            "call distcourse.runtime.shutdown() first"
        )
    local_rank = rank if local_rank is None else local_rank
    local_world_size = world_size if local_world_size is None else local_world_size
    backend, device = pick_backend(local_rank, local_world_size, backend)
    if is_loopback(host):  # one machine: nothing listens beyond it
        keep_gloo_on_loopback()
    if store is None:
        store = make_store(rank, world_size, host, port, timeout)
    _join(
        backend,
        device,
        timeout,
        threads,
        debug,
        store=store,
        rank=rank,
        world_size=world_size,
    )
    _info = RankInfo(rank, world_size, local_rank, backend, device)
    return _info


def _join(
    backend: str,
    device: torch.device,
    timeout: float,
    threads: int | None,
    debug: bool,
    **rendezvous: Any,
) -> None:
    """Bind this rank to its device and create the default group (init's last step)."""
    if accelerator.is_gpu(device):  # CUDA's or the emulated GPU: one path
        accelerator.module(device).set_device(device)
    if device.type == emulate.DEVICE_TYPE:
        nccl.register()
    if threads and not accelerator.is_cuda(device):  # CPU and emulated ranks
        torch.set_num_threads(threads)  # share the host's cores
    previous = dist.get_debug_level()
    if debug:  # the level is read when the group is created; restored after
        dist.set_debug_level(dist.DebugLevel.DETAIL)
    try:
        dist.init_process_group(
            backend,
            timeout=as_timedelta(timeout),
            # binds NCCL to the GPU; the emulated group is Python and binds none
            device_id=device if accelerator.is_cuda(device) else None,
            **rendezvous,
        )
        # gloo's init returns on a rank once *its* connections are up; a rank that
        # then finished and exited could cut a peer still connecting ("Connection
        # closed by peer"). Nobody leaves init before everyone is connected.
        dist.barrier()
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
    if is_loopback(os.environ.get("MASTER_ADDR", "")):  # torchrun on one machine
        keep_gloo_on_loopback()
    _join(backend, device, timeout, threads=1, debug=False, **_attempt_store(timeout))
    _info = RankInfo(rank, world, local_rank, backend, device)
    return _info


def _attempt_store(timeout: float) -> dict[str, Any]:
    """Under torchrun, env://'s store with a prefix for this attempt
    (TORCHELASTIC_RESTART_COUNT); elsewhere nothing (plain env://).

    Why: after `--max-restarts` restarts a group, the new ranks meet in the same
    store as the dead ones, whose keys are still there. gloo then read a dead
    rank's address ("Connection refused" in connectFullMesh, then a barrier
    timeout; measured on 4 ranks, torch 2.14, static and c10d rendezvous;
    pytorch/pytorch#135712 is the same for NCCL's id). A prefix per attempt keeps
    each attempt's keys apart. The count is per node: fine for one torchrun agent
    or agents that restart together."""
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if attempt is None:
        return {}
    store, rank, world = next(dist.rendezvous("env://", timeout=as_timedelta(timeout)))
    prefixed = dist.PrefixStore(f"distcourse/attempt_{attempt}/", store)
    return dict(store=prefixed, rank=rank, world_size=world)


def require_initialized() -> RankInfo:
    """This rank's RankInfo; a clear error if no process group exists yet."""
    if not dist.is_initialized():
        raise RuntimeError(
            "no process group: call distcourse.runtime.init(...) (or cluster.start() "
            "in a notebook) before any collective"
        )
    if _info is None:  # initialised by someone else, e.g. plain torch code
        return RankInfo(
            dist.get_rank(),
            dist.get_world_size(),
            dist.get_rank(),
            dist.get_backend(),
            _device_of(dist.get_backend()),
        )
    return _info


def _device_of(backend: str) -> torch.device:
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    if emulate.enabled():
        return emulate.current()
    return torch.device("cpu")


def device() -> torch.device:
    """The device this rank's tensors should live on."""
    return require_initialized().device


def shutdown() -> None:
    """Destroy this process's process group, if any (safe to call twice). First the
    store learns that this rank returned (`inflight`): a rank still waiting in a
    collective it skipped is then told who left, not only that a peer is gone."""
    global _info
    if dist.is_initialized():
        p2p.drain()  # an emulated rank's eager sends land before its groups close
        inflight.mark_returned()
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
