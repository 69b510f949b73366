"""No process outlives its caller: a thread that exits this process when a PID is gone.

Spawned ranks watch the process that spawned them; notebook engines and their
controller watch the kernel. A test runner that kills a kernel (nbval does, without
running atexit handlers) therefore leaves no rank behind.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

import psutil


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
