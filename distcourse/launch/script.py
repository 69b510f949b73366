"""`run_script`: run a program as its reader would (`python file.py`), in a new process.

Programs copied from tutorials start their own ranks (`mp.spawn`, which needs a
function it can import by name, so not one defined in a notebook). Here they run as a
subprocess with a deadline, on a free port, with a private temporary directory, and
optionally with one line of their text swapped (`swap=(old, new)`): the way a reader
tries our DDP in PyTorch's own example by changing an import (a list of pairs swaps
several lines, each exactly once: FSDP2's import and its state-dict call). `by_rank`
sorts what its processes printed into one list of lines per rank, for
`columns.show`. `run_torchrun` starts a script under torchrun the same way (chapter
13's fault drill: `--max-restarts` and the stderr where torchrun reports a death).
"""

from __future__ import annotations

import ast
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import distcourse
from distcourse.rendezvous import LOOPBACK, keep_gloo_on_loopback

TORCH_DDP = "from torch.nn.parallel import DistributedDataParallel as DDP"
OUR_DDP = "from distcourse.parallel.ddp import DDP"
Swap = tuple[str, str]
RANK = re.compile(r"\brank (\d+)\b")


PORT_FLOOR = 20000  # above the usual fixed ports of local servers (8000, 8888, ...)


def ephemeral_floor() -> int:
    """The first port of the kernel's ephemeral range: Linux's ip_local_port_range
    (32768 by default), else IANA's 49152 (macOS and Windows use it)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 49152


def free_port() -> int:
    """A TCP port on the loopback interface that nothing listens on right now.

    Drawn below the ephemeral range, from which the kernel hands out the ports of
    outgoing connections and of listeners bound to port 0. gloo binds many of
    those, so an ephemeral port free now may be taken before the program listens
    on it (seen with 3 test files running: EADDRINUSE). A port below the range is
    taken only by a program that names it."""
    top, draw = ephemeral_floor(), random.SystemRandom()  # not the seeded global
    tries = 100 if top - PORT_FLOOR >= 1000 else 0  # an odd range: port 0 below
    for _ in range(tries):
        port = draw.randrange(PORT_FLOOR, top)
        with socket.socket() as sock:
            try:
                sock.bind((LOOPBACK, port))
            except OSError:  # in use: draw again
                continue
            return port
    with socket.socket() as sock:  # an odd range, or 100 ports in use: any port
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


def swapped(text: str, swap: tuple[str, str]) -> str:
    """`text` with the line `swap[0]` replaced by `swap[1]`; ValueError if absent.

    Exactly one line must match, so a swap that silently did nothing (and would
    compare a program with itself) cannot happen.
    """
    old, new = swap
    lines = text.splitlines(keepends=True)
    hits = [i for i, line in enumerate(lines) if line.rstrip("\n") == old]
    if len(hits) != 1:
        raise ValueError(f"expected exactly one line {old!r}, found {len(hits)}")
    lines[hits[0]] = new + "\n"
    return "".join(lines)


def excerpt(path: str | Path, *names: str, imports: bool = True) -> str:
    """The source of `path`'s top-level functions and classes `names`, in file order.

    With `imports`, its import lines come first: what a reader needs to see of a
    long script, taken from the file itself so the book cannot drift from it.
    """
    text = Path(path).read_text()
    found, parts = set(), []
    for node in ast.parse(text).body:
        wanted = imports and isinstance(node, (ast.Import, ast.ImportFrom))
        name = getattr(node, "name", None)
        if wanted or name in names:
            found.add(name)
            parts.append(ast.get_source_segment(text, node) or "")
    if missing := set(names) - found:
        raise ValueError(f"{path} defines no {sorted(missing)}")
    blocks = "\n".join(p for p in parts if p.startswith(("import", "from")))
    rest = "\n\n\n".join(p for p in parts if not p.startswith(("import", "from")))
    return f"{blocks}\n\n\n{rest}" if blocks else rest


def child_env(tmp: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """A program's environment: one CPU thread per process, a free MASTER_PORT,
    TMPDIR `tmp`, gloo on loopback, this `distcourse` on its path, block-buffered
    output unless `env` (added last) sets PYTHONUNBUFFERED."""
    root = str(Path(distcourse.__file__).resolve().parents[1])
    out = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "MASTER_PORT": str(free_port()),
        "TMPDIR": tmp,
        "PYTHONPATH": os.pathsep.join(
            p for p in (root, os.environ.get("PYTHONPATH")) if p
        ),
        **(env or {}),
    }
    if "PYTHONUNBUFFERED" not in (env or {}):
        out.pop("PYTHONUNBUFFERED", None)
    gloo_if = keep_gloo_on_loopback()
    if gloo_if:
        out.setdefault("GLOO_SOCKET_IFNAME", gloo_if)
    return out


def run_script(
    path: str | Path,
    *args: str,
    swap: Swap | list[Swap] | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 120.0,
) -> str:
    """Run `python path args...` and return its standard output.

    The child gets one CPU thread per process, a free MASTER_PORT, its own TMPDIR
    (removed afterwards), gloo on the loopback interface, and this `distcourse` on its
    path. Its stdout is block-buffered even where PYTHONUNBUFFERED is set here:
    unbuffered, `print` writes its text and its newline apart, and the processes
    of one program cut each other's lines in two; buffered, each line arrives
    whole, as it does on a terminal. RuntimeError with the end of stderr if it
    fails; TimeoutExpired after `timeout` seconds (the child is killed).
    """
    path = Path(path)
    with tempfile.TemporaryDirectory(prefix="distcourse-script-") as tmp:
        if swap is not None:
            program = Path(tmp) / path.name
            text = path.read_text()
            for pair in [swap] if isinstance(swap, tuple) else swap:
                text = swapped(text, pair)
            program.write_text(text)
        else:
            program = path
        done = subprocess.run(
            [sys.executable, str(program), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=child_env(tmp, env),
        )
    if done.returncode != 0:
        tail = "\n".join(done.stderr.splitlines()[-20:])
        raise RuntimeError(f"{path.name} exited with {done.returncode}:\n{tail}")
    return done.stdout


def run_torchrun(
    path: str | Path,
    *args: str,
    ranks: int,
    max_restarts: int = 0,
    env: dict[str, str] | None = None,
    timeout: float = 180.0,
) -> subprocess.CompletedProcess:
    """`torchrun --nproc-per-node ranks --max-restarts max_restarts path args...`
    on this machine (rendezvous on loopback, a free port; `child_env`). Returns
    the finished process: its stdout, and its stderr, where torchrun says which
    worker died and how. RuntimeError with the end of stderr if it fails."""
    with tempfile.TemporaryDirectory(prefix="distcourse-torchrun-") as tmp:
        child = child_env(tmp, env)
        agent = ["-m", "torch.distributed.run", "--nproc-per-node", str(ranks)]
        agent += ["--max-restarts", str(max_restarts), "--master-addr", LOOPBACK]
        agent += ["--master-port", child["MASTER_PORT"]]
        done = subprocess.run(
            [sys.executable, *agent, str(path), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=child,
        )
    if done.returncode != 0:
        tail = "\n".join(done.stderr.splitlines()[-20:])
        raise RuntimeError(
            f"torchrun {Path(path).name} exited with {done.returncode}:\n{tail}"
        )
    return done


def by_rank(
    text: str, world_size: int, pattern: str | re.Pattern[str] = RANK
) -> list[list[str]]:
    """`text`, a program's output, as one list of lines per rank, for `columns.show`.

    Each line goes to the rank whose number `pattern`'s first group captures
    ("rank 1" by default); each rank's lines keep the order it printed them in,
    however the processes' lines interleaved. Blank lines are dropped. ValueError
    for a line that names no rank, or a rank outside the world.
    """
    lines: list[list[str]] = [[] for _ in range(world_size)]
    for line in text.splitlines():
        if not line.strip():
            continue
        found = re.search(pattern, line)
        if found is None:
            raise ValueError(f"by_rank: names no rank: {line!r}")
        rank = int(found.group(1))
        if not 0 <= rank < world_size:
            raise ValueError(f"by_rank: rank {rank} of {world_size}: {line!r}")
        lines[rank].append(line)
    return lines
