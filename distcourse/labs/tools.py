"""The method's tools, run live on gloo ranks: what each says about a broken call.

- `detail(case)`: `TORCH_DISTRIBUTED_DEBUG=DETAIL` on 2 ranks whose collectives
  differ in shape ("shape") or in op ("op"): its error, trimmed; or two same-shape
  all-reduces in another order on each rank ("swap"), which it lets through.
- `monitored_barrier(world, missing)`: `dist.monitored_barrier(wait_all_ranks=True)`
  naming every rank that never arrived.
- `ddp_unused()`: torch DDP's error for a parameter without a gradient, at debug
  level OFF (parameter indices) and INFO (their names).

Each call spawns its ranks, ends them within seconds, and returns lines that are the
same on any machine: ranks, ops, shapes and torch's words, never a port, a path, a
process id or a time. Ranks send their own stdout/stderr to /dev/null, so torch's
C++ log lines (timestamped) do not reach the notebook.
"""

from __future__ import annotations

import os
import re
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from distcourse.labs.report import first_sentence, ranks_text
from distcourse.labs.silent import TwoHeads
from distcourse.launch.spawn import spawn

CASES = ("shape", "op", "swap")


def quiet() -> None:
    """Send this rank's stdout and stderr (torch's C++ logs too) to /dev/null."""
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)


def _detail_rank(case: str) -> dict:
    """Rank body: the mismatched calls of `case`; torch's error, or the results."""
    quiet()
    rank = dist.get_rank()
    try:
        if case == "shape":  # rank 0 all-reduces 4 numbers, rank 1 two
            dist.all_reduce(torch.zeros(4 if rank == 0 else 2))  # devicecheck: host
        elif case == "op":  # the same tensor, but another collective
            t = torch.zeros(4)  # devicecheck: host (these tools run on gloo)
            if rank == 0:
                dist.all_reduce(t)  # devicecheck: host
            else:
                dist.broadcast(t, src=0)  # devicecheck: host
        else:  # two gradients of one shape, reduced in another order on rank 1
            a, b = torch.full((4,), rank + 1.0), torch.full((4,), 10.0 * (rank + 1))
            for grad in (a, b) if rank == 0 else (b, a):
                dist.all_reduce(grad)
            return {"a": a[0].item(), "b": b[0].item()}
    except RuntimeError as err:
        return {"error": str(err)}
    return {}


def _without_device_options(text: str) -> str:
    """DETAIL's fingerprints without their long `TensorDeviceTypes=TensorOptions(..)`
    (nested brackets: cut to the bracket that closes it)."""
    key = ", TensorDeviceTypes="
    while (start := text.find(key)) >= 0:
        depth, i = 0, text.index("(", start)
        while True:
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
            if depth == 0:
                break
        text = text[:start] + text[i:]
    return text


def detail_lines(message: str) -> list[str]:
    """DETAIL's mismatch error, one clause a line: who runs what, and what differs."""
    text = re.sub(r"\s+", " ", _without_device_options(message)).strip()
    text = re.sub(r"\.Collectives differ", ".\nCollectives differ", text)
    text = re.sub(r" (Rank \d+ is running|but Rank \d+)", r"\n  \1", text)
    return [line.rstrip() for line in text.splitlines()]


def detail(case: str, timeout: float = 3.0) -> list[str]:
    """Run `case` ("shape", "op" or "swap") on 2 ranks under DETAIL; what rank 0
    was told, or, for "swap", that nothing was said and what each rank got."""
    if case not in CASES:
        raise ValueError(f"case must be one of {CASES}, got {case!r}")
    outs = spawn(_detail_rank, 2, case, backend="gloo", timeout=timeout, debug=True)
    if "error" in outs[0]:
        return [
            "rank 0 raised:",
            *(f"  {line}" for line in detail_lines(outs[0]["error"])),
        ]
    if case != "swap":
        return ["DETAIL raised nothing"]
    lines = ["DETAIL raised nothing: the same op, shape [4] and dtype on both ranks"]
    for rank, out in enumerate(outs):
        lines.append(f"  rank {rank}: a = {out['a']:.0f}, b = {out['b']:.0f}")
    lines.append("  one process: a = 1 + 2 = 3, b = 10 + 20 = 30")
    return lines


def _barrier_rank(missing: tuple[int, ...], wait: float) -> str:
    """Rank body: a monitored barrier, except on `missing` ranks (busy elsewhere
    for longer than the barrier waits); the first sentence of its error."""
    quiet()
    if dist.get_rank() in missing:
        time.sleep(wait + 0.5)
        return "never called it"
    try:
        dist.monitored_barrier(timeout=timedelta(seconds=wait), wait_all_ranks=True)
    except RuntimeError as err:
        return first_sentence(err).lstrip(": ")  # after its "[Rank 0]:"
    return "passed"


def monitored_barrier(
    world: int = 4, missing: tuple[int, ...] = (1, 3), wait: float = 1.0
) -> list[str]:
    """`monitored_barrier(wait_all_ranks=True)` on `world` ranks, `missing` never
    coming: what each rank ends with, ranks that ended alike on one line."""
    outs = spawn(_barrier_rank, world, missing, wait, backend="gloo", timeout=wait + 2)
    said: dict[str, list[int]] = {}
    for rank, text in enumerate(outs):
        said.setdefault(text, []).append(rank)
    return [f"{ranks_text(ranks)}: {text}" for text, ranks in said.items()]


def _ddp_rank(levels: tuple[str, ...]) -> list[str]:
    """Rank body: torch DDP on a model whose `aux` head gets no gradient, two steps,
    once per debug level (read when DDP is built); its error at step 2 each time."""
    quiet()
    said = []
    previous = dist.get_debug_level()
    try:
        for level in levels:
            dist.set_debug_level(getattr(dist.DebugLevel, level))
            torch.manual_seed(0)
            model: nn.Module = DDP(TwoHeads())  # devicecheck: host (gloo)
            try:
                for _ in range(2):
                    model(torch.randn(8, 4)).sum().backward()
                said.append("no error")
            except RuntimeError as err:
                said.append(str(err))
    finally:
        dist.set_debug_level(previous)
    return said


def ddp_unused(levels: tuple[str, ...] = ("OFF", "INFO")) -> list[str]:
    """What torch DDP's error says about the parameters that got no gradient, on
    rank 0, at each `TORCH_DISTRIBUTED_DEBUG` level: its lines naming them."""
    messages = spawn(_ddp_rank, 2, levels, backend="gloo", timeout=3.0)[0]
    lines = []
    for level, message in zip(levels, messages, strict=True):
        lines.append(f"TORCH_DISTRIBUTED_DEBUG={level}:")
        for line in message.splitlines():
            if "did not receive grad" in line or "In addition" in line:
                lines.append(f"  {line.strip()}")
    return lines
