"""Ranks for a notebook: ipyparallel engines, one per rank, driven by `%%px` cells.

    ranks = cluster.start(4)     # 4 engines, a process group on every one
    %%px
    print(rank, world_size, device)
    ranks.stop()

On a CPU machine each engine is a gloo rank; on a GPU box each engine owns one GPU and
joins an NCCL group. The kernel serves the rendezvous store on a port the operating
system picks (no race for a "free" port), ranks are assigned explicitly (rank r is
engine r), `%%px` output is made deterministic (no streaming, no progress bars), and
every engine exits by itself if the kernel dies.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import cloudpickle
import ipyparallel as ipp
from ipyparallel.cluster.launcher import LocalControllerLauncher, MPIEngineSetLauncher

from distcourse import rendezvous, runtime
from distcourse.arguments import positive_int

DEFAULT_RANKS = 4  # on a CPU machine; a GPU box defaults to one rank per GPU
HUB_TIMEOUT = 60  # seconds for the controller to answer the first connection
# Engines become visible on the controller's heartbeat, so its period bounds how
# soon a cluster is ready; ipyparallel's default period (3 s) would hold up every
# start. 200 ms beats with 150 allowed misses keep the default's 30 s tolerance for
# an engine that stops answering.
_CONTROLLER_ARGS = [
    "--usethreads",  # schedulers as threads: fewer processes on a small machine
    "--HeartMonitor.period=200",
    "--HeartMonitor.max_heartmonitor_misses=150",
]
_ENGINE_ARGS = [
    "--IPEngine.enable_nanny=False",  # the watchdog does the nanny's job
    "--IPEngine.wait_for_url_file=60",
    # ipyparallel's engine gives up on registering after 5 s and exits 0: seen in CI
    # on 2 cores with other tests running ("Engine set stopped: exit_code 0"); the
    # controller answers within HUB_TIMEOUT, so the engines wait as long
    f"--IPEngine.timeout={HUB_TIMEOUT}",
]


class _ForkingEngines(MPIEngineSetLauncher):
    """Start all engines as forks of one process that has imported torch already."""

    @property
    def program(self) -> list[str]:
        return []

    @property
    def program_args(self) -> list[str]:
        return self.cluster_args + self.engine_args


@dataclass
class Ranks:
    """A running set of notebook ranks: the engines, their client and `%%px` view."""

    cluster: ipp.Cluster
    client: ipp.Client
    view: ipp.DirectView
    world_size: int
    backend: str
    store: Any = field(repr=False)
    timings: dict[str, float] = field(default_factory=dict)

    def run(self, fn: Any, *args: Any, **kwargs: Any) -> list[Any]:
        """Call fn(*args, **kwargs) on every rank; results in rank order.

        A failure raises RankError naming the first rank that raised.
        """
        payload = cloudpickle.dumps((fn, args, kwargs))  # by value: lambdas too
        result = self.view.apply_async(_call, payload)
        try:
            return result.get()
        except ipp.error.CompositeError as err:
            rank, name, value = _first_error(err)
            raise runtime.RankError(rank, f"{name}: {value}") from None

    def pull(self, name: str, rank: int = 0) -> Any:
        """The value of variable `name` on `rank`, copied into the notebook."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank must be in 0..{self.world_size - 1}, got {rank}")
        return self.client[rank].pull(name, block=True)

    def stop(self) -> None:
        """Shut down the process groups, the engines and the controller."""
        global _current
        try:
            self.view.execute(
                "from distcourse import runtime as _rt; _rt.shutdown()", block=True
            )
        except Exception:  # an engine may already be gone; stopping must still work
            pass
        self.client.close()
        self.cluster.stop_cluster_sync()
        self.store = None
        if _current is self:
            _current = None


def _call(payload: bytes) -> Any:
    import cloudpickle

    fn, args, kwargs = cloudpickle.loads(payload)
    return fn(*args, **kwargs)


def _first_error(err: ipp.error.CompositeError) -> tuple[int, str, str]:
    """(rank, exception name, message) of the lowest failing rank (rank = engine id)."""
    name, value, _tb, info = min(err.elist, key=lambda e: e[3].get("engine_id", 0))
    return info.get("engine_id", -1), name, value


_current: Ranks | None = None


def _engine_init(
    rank: int,
    world_size: int,
    port: int,
    backend: str | None,
    timeout: float,
    debug: bool,
    path: list[str],
) -> dict[str, Any]:
    """Runs on each engine: see the kernel's modules, join the group via its store."""
    sys.path.extend(p for p in path if p not in sys.path)
    store = rendezvous.make_store(
        rank, world_size, rendezvous.LOOPBACK, port, timeout, serve=False
    )
    info = runtime.init(
        rank, world_size, store=store, backend=backend, timeout=timeout, debug=debug
    )
    return {"backend": info.backend, "device": str(info.device)}


def processes(ranks: Ranks) -> list[int]:
    """PIDs of every process behind `ranks`: controller, engine launcher, engines,
    and their children. Tests use it to prove that nothing outlives a notebook."""
    import psutil

    roots = [ranks.cluster.controller.process.pid]
    roots += [es.process.pid for es in ranks.cluster.engines.values()]
    pids = set(roots) | set(ranks.run(os.getpid))
    for pid in roots:
        pids |= {c.pid for c in psutil.Process(pid).children(recursive=True)}
    return sorted(pids)


def default_ranks() -> int:
    """One rank per GPU on a GPU box, else DEFAULT_RANKS (also where DISTCOURSE_DEVICE
    is 'cpu', as in the test configuration: the stored outputs' rank count, or
    'emulated')."""
    if runtime.device_preference() in ("cpu", runtime.EMULATED):
        return DEFAULT_RANKS
    return runtime.gpu_count() or DEFAULT_RANKS


def start(
    n: int | None = None,
    *,
    backend: str | None = None,
    timeout: float = runtime.DEFAULT_TIMEOUT,
    debug: bool = False,
    activate: bool = True,
    device: str | None = None,
) -> Ranks:
    """Start `n` ranks as ipyparallel engines and initialise a process group on each.

    Any ranks this kernel started before are stopped first, so re-running a notebook
    from the top works. `timeout` bounds every collective on the new group; `debug`
    checks every collective and names the ranks that did not arrive (runtime.init).
    `device` ('cpu', 'cuda' or 'emulated') chooses the ranks' device as
    DISTCOURSE_DEVICE does: 'emulated' gives each rank an emulated GPU
    (`distcourse.emulate`), to see on a laptop whether the code would run on GPUs.
    """
    global _current
    if device is not None and backend is not None:
        raise ValueError("pass backend or device, not both")
    backend = backend or device
    n = default_ranks() if n is None else n
    positive_int(n, "number of ranks")
    rendezvous.as_timedelta(timeout)
    runtime.pick_backend(0, n, backend)  # a bad backend fails here, not on n engines
    if _current is not None:
        _current.stop()
    t0 = time.perf_counter()
    store = rendezvous.serve_store(n, timeout)  # the kernel serves the rendezvous
    cluster = _make_cluster(n, debug)
    try:
        client, view, infos, t1 = _connect(cluster, n, store, backend, timeout, debug)
    except BaseException:
        cluster.stop_cluster_sync()  # a half-started set of ranks must not linger
        raise
    t2 = time.perf_counter()
    ranks = Ranks(cluster, client, view, n, infos[0]["backend"], store)
    ranks.timings = {"engines": t1 - t0, "process group": t2 - t1, "total": t2 - t0}
    _current = ranks
    if activate:
        _activate(view)
    return ranks


def _connect(
    cluster: ipp.Cluster,
    n: int,
    store: Any,
    backend: str | None,
    timeout: float,
    debug: bool,
) -> tuple[ipp.Client, ipp.DirectView, list[dict], float]:
    """Start the engines, wait for all n, join each to the group as rank = engine id."""
    cluster.start_cluster_sync()
    # ipyparallel waits 10 s for the controller's reply; a loaded 2-core machine
    # (tests two at a time, a notebook starting its engines) has taken longer
    client = cluster.connect_client_sync(timeout=HUB_TIMEOUT)
    client.wait_for_engines(n, timeout=120, interactive=False)
    ready = time.perf_counter()
    ids = sorted(client.ids)
    if ids != list(range(n)):
        raise RuntimeError(f"expected engines 0..{n - 1}, got {ids}")
    view = client[ids]
    view.block = True
    asyncs = [
        client[r].apply_async(
            _engine_init, r, n, store.port, backend, timeout, debug, sys.path
        )
        for r in ids
    ]
    infos = [a.get(timeout=timeout + 10) for a in asyncs]
    view.execute(NAMESPACE)
    return client, view, infos, ready


# names every %%px and %%ranks cell can use (tests/controls/harness.py gives the
# same names to the cells it runs on spawned ranks)
NAMESPACE = """
import torch, torch.distributed as dist
from distcourse import runtime
_info = runtime.require_initialized()
rank, world_size, device, backend = (
    _info.rank, _info.world_size, _info.device, _info.backend
)
"""


def _make_cluster(n: int, debug: bool = False) -> ipp.Cluster:
    kernel = str(os.getpid())
    entry = [sys.executable, "-m", "distcourse.launch.engine"]
    cluster = ipp.Cluster(
        n=n,
        cluster_id=f"distcourse-{uuid.uuid4().hex[:8]}",
        log_level=logging.ERROR,
        controller_launcher_class=LocalControllerLauncher,
        engine_launcher_class=_ForkingEngines,
        controller_args=_CONTROLLER_ARGS,
        # engines find the controller's file themselves, so they can import torch
        # while the controller starts, instead of after it
        send_engines_connection_env=False,
    )
    config = cluster.config  # both run under a watchdog on this kernel: see _ipp
    config.LocalControllerLauncher.controller_cmd = [*entry, "controller", kernel]
    config.MPIEngineSetLauncher.mpi_cmd = [*entry, "engines", kernel]
    config.EngineLauncher.engine_args = _ENGINE_ARGS
    if debug:
        # A debug group raises what it finds, naming the ranks. torch's C++ logger
        # prints each error again on the engine's stderr, timestamped, and the engine
        # forwards such low-level output late, into whichever cell runs then.
        level = os.environ.get("TORCH_CPP_LOG_LEVEL", "FATAL")
        config.MPIEngineSetLauncher.environment = {"TORCH_CPP_LOG_LEVEL": level}
    return cluster


def _activate(view: ipp.DirectView) -> None:
    """Register %%px for `view`, configured for output that is the same every run,
    and %%ranks (distcourse.launch.ranks)."""
    from ipyparallel.client.magics import ParallelMagics
    from IPython import get_ipython

    from distcourse.launch import ranks

    shell = get_ipython()
    if shell is None:
        return
    magics = ParallelMagics(shell, view, "")
    magics.stream_output = False  # print all output after the cell, in rank order
    magics.progress_after_seconds = -1  # no progress bar in the stored output
    shell.magics_manager.register(magics)
    ranks.register(shell, current_view)  # %%ranks: each rank's output in a column


def current() -> Ranks | None:
    """The ranks this kernel started last and has not stopped (%%ranks runs there)."""
    return _current


def current_view() -> ipp.DirectView | None:
    """The DirectView of `current()`, or None: what %%ranks runs a cell on."""
    return None if _current is None else _current.view


def load_ipython_extension(shell: object) -> None:
    """`%load_ext distcourse.launch.cluster`: %%ranks without starting ranks here."""
    from distcourse.launch import ranks

    ranks.register(shell, current_view)


def stop() -> None:
    """Stop the ranks this kernel started, if any."""
    if _current is not None:
        _current.stop()
