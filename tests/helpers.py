"""Small helpers the test files share (imported as `helpers`: pytest puts tests/ on
the path, as tests/ is not a package).

- `ints`: small integer-valued float64 inputs, so that sums in any order are exact
  and a sharded result can be compared with one process by equality;
- `linear`: F.linear with the weight and bias as positional inputs, so that an op
  table can give each its own SBP;
- `assert_refused`: every case of `checks.outcomes` raised, and the errors say what
  a reader needs; `refused_on`: the same on each of a spawn's ranks;
- `torchrun`: the arguments after `python` that start torchrun on this machine with
  a free port of its own, never torchrun's default 29500, which two test runs at
  once would share; `run_python`: `python` with arguments, run as a reader runs
  the book's scripts (from the repository's root, on the CPU, output captured);
- `planted`: a module's function replaced by a fake for one block (the negative
  controls plant faults in the code under test with it);
- `two_nodes`: a script on 8 ranks as 2 torchrun "nodes" x 4 processes on
  loopback (c10d rendezvous), each node's (status, stdout, stderr);
- `timed_error` / `disagreements`: the error each rank's bad call raised and how
  soon, for checks that ranks which disagree are named within seconds;
- `torch_sequence_parallel_plan`: torch's `parallelize_module` plan for a TinyGPT
  block with sequence parallelism, as chapter 4 writes it; `torch_parallelized`: a
  copy of a model under such a plan, torch's side of a tensor-parallel comparison.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from distcourse.launch import spawn
from distcourse.launch.script import free_port
from distcourse.rendezvous import LOOPBACK


def ints(shape: tuple[int, ...], seed: int) -> Tensor:
    """Integers in [-4, 4] as float64, the same for a seed on every rank."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(-4, 5, shape, generator=gen).to(torch.float64)


def linear(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    return F.linear(x, w, b)


def assert_refused(lines: list[str], *words: str) -> None:
    """`lines` from checks.outcomes: no case ended without an error, and the errors
    together contain each of `words`."""
    text = "\n".join(lines)
    assert "no error" not in text, text
    for w in words:
        assert w in text, (w, text)


def refused_on(
    outcomes: Callable[[], list[str]], ranks: int, *words: str
) -> list[list[str]]:
    """Spawn `outcomes` (a rank's `checks.outcomes` lines of bad calls) on `ranks`
    ranks and `assert_refused(lines, *words)` on each rank's; the lines by rank."""
    found = spawn(outcomes, ranks, timeout=10)
    for lines in found:
        assert_refused(lines, *words)
    return found


def torchrun(ranks: int) -> list[str]:
    """`-m torch.distributed.run` for `ranks` processes on this machine, with its
    rendezvous on a loopback port that nothing listens on now."""
    return [
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(ranks),
        "--master-addr",
        LOOPBACK,
        "--master-port",
        str(free_port()),
    ]


def run_python(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python *args` from the repository's root, one thread a process, on the CPU
    (`DISTCOURSE_DEVICE=cpu`); its status and output, never raised on."""
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=Path(__file__).resolve().parents[1],
        env={**os.environ, "OMP_NUM_THREADS": "1", "DISTCOURSE_DEVICE": "cpu"},
        check=False,
    )


@contextmanager
def planted(module: ModuleType, name: str, fake: Callable) -> Iterator[None]:
    """`module.name` replaced by `fake` while the block runs (every rank plants it)."""
    real = getattr(module, name)
    setattr(module, name, fake)
    try:
        yield
    finally:
        setattr(module, name, real)


def two_nodes(
    script: list[str], rdzv_id: str, timeout: float = 240
) -> list[tuple[int, str, str]]:
    """Run `script` (its path and flags) on 2 torchrun agents of 4 ranks each, their
    rendezvous on loopback only; each agent's (returncode, stdout, stderr). c10d
    numbers the nodes in order of arrival: rank 0 is on either."""
    port = free_port()
    agent = [
        sys.executable,
        *("-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "4"),
        *("--rdzv-backend", "c10d", "--rdzv-endpoint", f"{LOOPBACK}:{port}"),
        *("--rdzv-id", rdzv_id, "--local-addr", LOOPBACK),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DISTCOURSE_DEVICE": "cpu"}
    nodes = [
        subprocess.Popen(
            [*agent, "--node-rank", str(i), *script],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).resolve().parents[1],
            env=env,
        )
        for i in range(2)
    ]
    try:
        outs = [node.communicate(timeout=timeout) for node in nodes]
    finally:
        for node in nodes:
            node.kill()  # no-op if it ended; never leave one behind
    return [(n.returncode, o, e) for n, (o, e) in zip(nodes, outs, strict=True)]


def refused_alike(fn: Callable[[], dict], ranks: int = 2) -> dict:
    """Run `fn` on `ranks` ranks, where each rank collects the errors of bad calls:
    they must come within a minute and be the same on every rank; return rank 0's."""
    start = time.monotonic()
    errors = spawn(fn, ranks, timeout=5)
    assert time.monotonic() - start < 60  # an error, never a wait for the timeout
    assert all(e == errors[0] for e in errors)
    return errors[0]


def timed_error(call: Callable[[], object]) -> tuple[str, float]:
    """("Type: message", seconds) of the error `call` raised, or ("no error", s)."""
    start = time.monotonic()
    try:
        call()
    except (ValueError, TypeError) as err:
        return f"{type(err).__name__}: {err}", time.monotonic() - start
    return "no error", time.monotonic() - start


ERROR_WITHIN = 3.0  # seconds: a bad input must end in an error this soon


def disagreements(cases: Callable[[], dict], ranks: int = 2) -> list[dict]:
    """Spawn `ranks` ranks running `cases` (each rank: name -> timed_error); assert
    every error came within ERROR_WITHIN seconds; return the results by rank."""
    found = spawn(cases, ranks, timeout=10)
    for rank, errors in enumerate(found):
        for name, (_, seconds) in errors.items():
            assert seconds <= ERROR_WITHIN, (rank, name, seconds)
    return found


def tanh_chain() -> nn.Sequential:
    """Eight Linear(8, 8) + Tanh blocks, seeded: the pipeline tests' model to cut."""
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(8)])


def chain_batch() -> tuple[Tensor, Tensor]:
    """A seeded batch (x, y) of 8 rows for tanh_chain."""
    gen = torch.Generator().manual_seed(1)
    return torch.randn(8, 8, generator=gen), torch.randn(8, 8, generator=gen)


def torch_sequence_parallel_plan() -> dict[str, ParallelStyle]:
    """torch's plan for one TinyGPT block with sequence parallelism (chapter 4): the
    norms on the sequence-split input, each sub-layer gathering the tokens first,
    column-parallel in, row-parallel out back to the split."""
    gather = PrepareModuleInput(
        input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
    )
    return {
        "ln1": SequenceParallel(),
        "ln2": SequenceParallel(),
        "attn": gather,
        "mlp": copy.deepcopy(gather),
        "attn.query": ColwiseParallel(),
        "attn.key": ColwiseParallel(),
        "attn.value": ColwiseParallel(),
        "mlp.fc": ColwiseParallel(),
        "attn.proj": RowwiseParallel(output_layouts=Shard(1)),
        "mlp.proj": RowwiseParallel(output_layouts=Shard(1)),
    }


def torch_parallelized(model: nn.Module, plan: dict[str, ParallelStyle]) -> nn.Module:
    """A copy of `model` under torch's `parallelize_module(plan)` on a 1-D CPU mesh of
    the whole world (`model` itself stays whole: ours is made from it)."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    return parallelize_module(copy.deepcopy(model), mesh, plan)
