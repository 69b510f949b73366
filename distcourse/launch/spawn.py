"""`spawn(fn, world_size)`: run a function on N local ranks, for tests and demos.

Ranks are forked from a forkserver that imported torch once, so a 4-rank job starts in
well under a second. If a rank raises or dies, the others are stopped at once and the
caller gets a RankError that names the rank; no child outlives the call.
"""

from __future__ import annotations

import os
import pickle
import signal
import time
import traceback
from collections.abc import Callable
from typing import Any

from distcourse import inflight
from distcourse.arguments import positive_int
from distcourse.launch.watchdog import watch_parent
from distcourse.rendezvous import LOOPBACK, as_timedelta, make_store, serve_store
from distcourse.runtime import DEFAULT_TIMEOUT, RankError, init, shutdown

_preloaded = False
# Imported once by the forkserver, so that no rank imports them again. DTensor, device
# meshes and pipelines on meta tensors import torch._dynamo on first use, a heavy
# import every rank would otherwise pay again (the engines do the same).
PRELOAD = [
    "torch",
    "torch._dynamo",
    "torch.distributed.tensor",
    "torch.distributed.pipelining",
    "distcourse.launch.spawn",
]


def _context() -> Any:
    """A forkserver that imported PRELOAD once: each rank is a fork of it, ready."""
    global _preloaded
    import multiprocessing as mp

    ctx = mp.get_context("forkserver")
    if not _preloaded:
        ctx.set_forkserver_preload(PRELOAD)
        _preloaded = True
    return ctx


def _child(
    rank: int, world_size: int, payload: bytes, port: int, options: dict, conn: Any
) -> None:
    """Body of one spawned rank: join the group, run fn, send back (ok, value)."""
    import cloudpickle

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the caller decides when we stop
    watch_parent(options.pop("caller"))
    try:
        fn, args, kwargs = cloudpickle.loads(payload)
        if options["init"]:
            store = make_store(
                rank, world_size, LOOPBACK, port, options["timeout"], serve=False
            )
            init(
                rank,
                world_size,
                store=store,
                backend=options["backend"],
                timeout=options["timeout"],
                debug=options["debug"],
            )
        result = fn(*args, **kwargs)
        reply = ("ok", pickle.dumps(result))
    except BaseException as err:  # report everything, even SystemExit
        why = inflight.explain(err)  # a rank that returned while this one waited
        said = f"{why}\n" if why else ""
        reply = (
            "error",
            f"{said}{type(err).__name__}: {err}\n{traceback.format_exc()}",
        )
    conn.send(reply)
    conn.close()
    if reply[0] == "ok":
        shutdown()
    os._exit(0 if reply[0] == "ok" else 1)


def spawn(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    backend: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    deadline: float | None = None,
    init_group: bool = True,
    debug: bool = False,
    **kwargs: Any,
) -> list[Any]:
    """Run `fn(*args, **kwargs)` on `world_size` local ranks; return results by rank.

    Each rank joins a process group (unless `init_group=False`) with the given
    collective `timeout`. If any rank raises or dies, the others are stopped at once
    and RankError names the first failing rank. The whole call ends within `deadline`
    seconds (default: 2 x timeout + 30), and no child outlives it. `fn` may be a
    lambda or a notebook function: it travels by cloudpickle. `debug` as in
    `runtime.init`.
    """
    from multiprocessing.connection import wait

    import cloudpickle

    positive_int(world_size, "world_size")
    as_timedelta(timeout)
    deadline = 2 * timeout + 30 if deadline is None else deadline
    ctx = _context()
    payload = cloudpickle.dumps((fn, args, kwargs))
    store = serve_store(world_size, timeout) if init_group else None  # held till done
    port = store.port if store is not None else 0
    options = dict(backend=backend, timeout=timeout, init=init_group, debug=debug)
    procs, conns = [], {}
    try:
        for rank in range(world_size):
            recv, send = ctx.Pipe(duplex=False)
            opts = dict(options, caller=os.getpid())
            proc = ctx.Process(
                target=_child,
                args=(rank, world_size, payload, port, opts, send),
                name=f"rank-{rank}",
                daemon=True,
            )
            proc.start()
            send.close()
            procs.append(proc)
            conns[recv] = rank
        return _collect(procs, conns, time.monotonic() + deadline, wait)
    finally:
        _stop_all(procs)


def _collect(procs: list, conns: dict, end: float, wait: Callable) -> list[Any]:
    """Wait for every rank's reply; raise RankError on the first failure.

    A rank that dies closes its pipe, so `wait` wakes on a crash as on a reply.
    """
    results: dict[int, Any] = {}
    while conns:
        left = end - time.monotonic()
        ready = wait(list(conns), timeout=max(left, 0))
        if not ready:
            missing = sorted(conns.values())
            raise TimeoutError(f"ranks {missing} did not finish within the deadline")
        for conn in ready:
            rank = conns.pop(conn)
            failure = _receive(procs, conn, rank, results)
            if failure is not None:
                raise _cause(failure, procs, conns, wait)
    return [results[r] for r in range(len(procs))]


class RankDied(RankError):
    """A rank whose process ended without a reply (a crash, os._exit, a kill)."""


# how long an error waits for a rank's death to surface before it is reported
DEATH_GRACE = 2.0


def _receive(procs: list, conn: Any, rank: int, results: dict) -> RankError | None:
    """Read `rank`'s reply into `results`; its failure (an error or a death), if any."""
    try:
        status, value = conn.recv()
    except EOFError:
        procs[rank].join(timeout=1)
        return RankDied(rank, f"process died (exit code {procs[rank].exitcode})")
    if status == "error":
        return RankError(rank, value)
    results[rank] = pickle.loads(value)
    return None


def _cause(failure: RankError, procs: list, conns: dict, wait: Callable) -> RankError:
    """The failure to report: a rank that died rather than one that only saw it die.

    When a rank crashes, its peers' next collective fails too ('Connection reset by
    peer'), and which pipe is read first is a race. So an error waits up to
    DEATH_GRACE seconds for a death among the ranks still running; a death wins."""
    if isinstance(failure, RankDied):
        return failure
    end = time.monotonic() + DEATH_GRACE
    while conns and (left := end - time.monotonic()) > 0:
        for conn in wait(list(conns), timeout=left):
            rank = conns.pop(conn)
            if isinstance(_receive(procs, conn, rank, {}), RankDied):
                code = procs[rank].exitcode
                return RankDied(
                    rank, f"process died (exit code {code}); then {failure}"
                )
    return failure


def _stop_all(procs: list) -> None:
    """Terminate, then kill, every child still alive; reap them all."""
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    for proc in procs:
        proc.join(timeout=2)
        if proc.is_alive():
            proc.kill()
            proc.join()
