"""Where ranks find each other: a TCPStore that listens on one address only.

A `torch.distributed.TCPStore` created from a host name and a port listens on *every*
interface: the host only tells clients where to connect. A store has no
authentication, so anyone who can reach the machine could read or overwrite the keys
that tell ranks where to find each other. Here the serving side binds its own socket
to the address it was given (loopback unless a multi-node run names another) and
hands it to the store through `master_listen_fd`.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket

import psutil
import torch.distributed as dist

from distcourse.arguments import positive_int

LOOPBACK = "127.0.0.1"  # single-host jobs listen and connect on this address only


def check_rank(rank: int, world_size: int) -> None:
    """ValueError unless world_size >= 1 and 0 <= rank < world_size (both ints)."""
    positive_int(world_size, "world_size")
    if not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be in 0..{world_size - 1}, got {rank!r}")


def as_timedelta(timeout: float) -> datetime.timedelta:
    """A positive timeout in seconds as a timedelta; ValueError for 0, None, < 0."""
    if not timeout or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout}")
    return datetime.timedelta(seconds=timeout)


def listen(host: str, port: int) -> int:
    """A socket listening on `host`:`port` alone (port 0: the OS picks); its fd.

    The caller owns the descriptor (a TCPStore takes it over). `host` "0.0.0.0" is
    every interface: only for a multi-node run on a private network.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock.detach()


def _serve(host: str, port: int, clients: int, timeout: float) -> dist.TCPStore:
    fd = listen(host, port)
    return dist.TCPStore(
        host,
        port,
        clients,
        is_master=True,
        timeout=as_timedelta(timeout),
        wait_for_workers=False,
        master_listen_fd=fd,
        use_libuv=True,
    )


def make_store(
    rank: int,
    world_size: int,
    host: str,
    port: int,
    timeout: float,
    serve: bool | None = None,
) -> dist.TCPStore:
    """The rendezvous store: rank 0 serves it on `host`:`port`, the others connect.

    `serve=False` makes every rank a client, for a store served elsewhere (a kernel).
    The server listens on `host` only: loopback for a single machine; a multi-node
    run passes the address of the interface the other nodes reach it on.
    """
    check_rank(rank, world_size)
    if not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"port must be in 0..65535, got {port!r}")
    serve = rank == 0 if serve is None else serve
    try:
        if serve:
            return _serve(host, port, world_size, timeout)
        return dist.TCPStore(
            host,
            port,
            world_size,
            is_master=False,
            timeout=as_timedelta(timeout),
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


def serve_store(world_size: int, timeout: float, host: str = LOOPBACK) -> dist.TCPStore:
    """A store served by this process on a port the OS picks, listening on `host`.

    The launcher (a notebook kernel, `spawn`) keeps it while its `world_size` ranks
    connect with `make_store(..., port=store.port, serve=False)`.
    """
    return _serve(host, 0, world_size + 1, timeout)


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and "localhost": addresses no other machine reaches."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: may resolve anywhere
        return False


def keep_gloo_on_loopback() -> str | None:
    """Make this process's gloo groups listen on the loopback interface.

    gloo binds each group's connections to the address its host name resolves to,
    which on many machines is a network interface other machines reach. For a
    single-host job, GLOO_SOCKET_IFNAME (read by gloo for every new group) is set to
    the loopback interface, unless the user set it. Returns the interface used.
    """
    if "GLOO_SOCKET_IFNAME" not in os.environ:
        for name, addresses in psutil.net_if_addrs().items():
            if any(a.address == LOOPBACK for a in addresses):
                os.environ["GLOO_SOCKET_IFNAME"] = name
                break
    return os.environ.get("GLOO_SOCKET_IFNAME")
