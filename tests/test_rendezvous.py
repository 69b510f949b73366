"""What listens where: single-host ranks listen on loopback only; stores fail clearly.

A TCPStore has no authentication. Notebook ranks, `spawn` groups and the benchmarks
run on one machine, so nothing of theirs may listen on an address another machine
can reach: not the rendezvous store, not gloo's connections, not the controller.
"""

from __future__ import annotations

import ipaddress
import os
import stat
from pathlib import Path

import psutil
import pytest
import torch.distributed as dist

from distcourse import rendezvous
from distcourse.launch import cluster, spawn


def _listening(pids: list[int]) -> set[tuple[int, str, int]]:
    """(pid, address, port) of every TCP socket (IPv4 and IPv6) these processes hold
    in LISTEN state."""
    found = set()
    for pid in pids:
        try:
            conns = psutil.Process(pid).net_connections(kind="tcp")
        except psutil.NoSuchProcess:
            continue
        for c in conns:
            if c.status == psutil.CONN_LISTEN:
                found.add((pid, c.laddr.ip, c.laddr.port))
    return found


def _exposed(sockets: set[tuple[int, str, int]]) -> list[str]:
    return [
        f"pid {pid} listens on {ip}:{port}"
        for pid, ip, port in sorted(sockets)
        if not ipaddress.ip_address(ip.split("%")[0]).is_loopback
    ]


def test_a_served_store_listens_on_loopback_only() -> None:
    store = rendezvous.serve_store(2, timeout=5)
    mine = {s for s in _listening([os.getpid()]) if s[2] == store.port}
    assert mine and not _exposed(mine), mine
    client = rendezvous.make_store(
        0, 2, rendezvous.LOOPBACK, store.port, 5, serve=False
    )
    client.set("key", "value")
    assert store.get("key") == b"value"


def test_a_busy_port_is_a_clear_error() -> None:
    store = rendezvous.serve_store(1, timeout=5)
    with pytest.raises(RuntimeError, match="already in use"):
        rendezvous.make_store(0, 1, rendezvous.LOOPBACK, store.port, 5)


def _rank_sockets(caller: int) -> tuple[list[str], int]:
    """On a rank: the sockets this rank and the spawning process listen on."""
    t = __import__("torch").ones(1)
    dist.all_reduce(t)  # gloo's connections are up
    sockets = _listening([os.getpid(), caller])
    return _exposed(sockets), len(sockets)


def test_a_spawned_group_listens_on_loopback_only() -> None:
    for exposed, count in spawn(_rank_sockets, 2, os.getpid(), timeout=10):
        assert count >= 1  # the caller's store, at least
        assert not exposed, exposed


def test_notebook_ranks_listen_on_loopback_only_and_keep_their_files_private() -> None:
    ranks = cluster.start(2)
    try:
        pids = [os.getpid(), *cluster.processes(ranks)]
        ranks.run(lambda: dist.barrier())
        sockets = _listening(pids)
        assert len(sockets) >= 3  # store, controller, engines
        assert not _exposed(sockets), _exposed(sockets)
        security = Path(ranks.cluster.profile_dir) / "security"
        files = sorted(security.glob(f"ipcontroller-{ranks.cluster.cluster_id}-*.json"))
        assert files, f"no connection files in {security}"
        for path in files:
            mode = stat.S_IMODE(path.stat().st_mode)
            assert mode & 0o077 == 0, f"{path.name} is readable by others: {oct(mode)}"
    finally:
        ranks.stop()
