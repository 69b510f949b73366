"""Process entry points for notebook ranks: `python -m distcourse.launch.engine ...`.

`engines KERNEL_PID -n N ARGS...` imports torch once, then forks N ipyparallel engines
from this warm process: each engine starts with torch already in memory, instead of
paying the import N times over on a small machine. `controller KERNEL_PID ARGS...`
runs the ipyparallel controller. Both watch the kernel: when it is gone (killed by a
test runner, say), they exit, so no process outlives its notebook.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import time


def _watch(kernel_pid: int) -> None:
    """Exit when the kernel is gone; so do processes forked from this one later
    (the controller forks its heart monitor, which has no thread of ours)."""
    from distcourse.launch.watchdog import watch_parent

    watch_parent(kernel_pid)
    os.register_at_fork(after_in_child=lambda: watch_parent(kernel_pid))


def controller(kernel_pid: int, argv: list[str]) -> None:
    """Run the ipyparallel controller until stopped or until the kernel is gone."""
    _watch(kernel_pid)
    from ipyparallel.controller.app import main

    main(argv=argv)


def engines(kernel_pid: int, n: int, argv: list[str]) -> None:
    """Fork `n` engines after importing torch; forward signals; reap them."""
    import ipyparallel.engine.app  # noqa: F401  (warm import, shared by the forks)

    # torch, and what DTensor and pipelines import on first use (torch._dynamo, a
    # heavy import), once here for all the forks instead of once per engine
    from distcourse.launch.spawn import PRELOAD

    for name in PRELOAD:
        importlib.import_module(name)

    children = []
    for _ in range(n):
        pid = os.fork()
        if pid == 0:  # an engine
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            _watch(kernel_pid)
            from ipyparallel.engine.app import main

            try:
                main(argv=argv)
            finally:
                os._exit(0)
        children.append(pid)

    def forward(signum: int, _frame: object) -> None:
        for child in children:
            try:
                os.kill(child, signum)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    from distcourse.launch.watchdog import pid_alive

    while children:
        pid, _status = os.waitpid(-1, os.WNOHANG)
        if pid:
            children.remove(pid)
            continue
        if not pid_alive(kernel_pid):
            forward(signal.SIGKILL, None)
        time.sleep(0.2)


def main(argv: list[str]) -> None:
    role, kernel_pid, rest = argv[0], int(argv[1]), argv[2:]
    if role == "controller":
        controller(kernel_pid, rest)
    elif role == "engines":
        if rest[:1] != ["-n"]:
            raise SystemExit("usage: engines KERNEL_PID -n N ARGS...")
        engines(kernel_pid, int(rest[1]), rest[2:])
    else:
        raise SystemExit(f"unknown role {role!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
