"""Which backend offers which operation: one column tried on the ranks, the rest cited.

`try_each` runs every operation of PyTorch's backend table on the live ranks, checks
its result, and says ✓ or ✘ from what happened. `DOCS` is the table in PyTorch's
documentation (https://pytorch.org/docs/stable/distributed.html, "Backends"), copied
as it stands there, '?' included (MPI on GPUs depends on the MPI build). `table` puts
the measured column beside the cited ones and labels which is which.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import Tensor

from distcourse import runtime, tables

OPS = (
    "send",
    "recv",
    "broadcast",
    "all_reduce",
    "reduce",
    "all_gather",
    "gather",
    "scatter",
    "reduce_scatter",
    "all_to_all",
    "barrier",
)
DOCS_URL = "https://pytorch.org/docs/stable/distributed.html#backends"
_ALL, _NONE = "✓" * len(OPS), "✘" * len(OPS)
# one character per entry of OPS, in that order, read from DOCS_URL's table
DOCS: dict[str, str] = {
    "gloo CPU": _ALL,
    "gloo GPU": "✘✘✓✓✓✓✓✓✓✓✘",
    "mpi CPU": "✓✓✓✓✓✓✓✓✘✓✓",
    "mpi GPU": "????????✘??",
    "nccl CPU": _NONE,
    "nccl GPU": _ALL,
}


def _send_recv(x: Tensor, r: int, n: int) -> bool:
    """Rank r sends x = [r + 1] to its right and receives from its left; even ranks
    send first, odd ones receive first, so no two blocking calls wait on each other."""
    got = torch.zeros_like(x)
    for step in ("send", "recv") if r % 2 == 0 else ("recv", "send"):
        if step == "send":
            dist.send(x, dst=(r + 1) % n)
        else:
            dist.recv(got, src=(r - 1) % n)
    return got.item() == (r - 1) % n + 1


def _cases(x: Tensor, r: int, n: int) -> dict[str, Callable[[], bool]]:
    """Each operation, run on rank r's x = [r + 1], and whether its result is right."""
    every = torch.arange(1.0, n + 1, device=x.device)  # x of every rank, in order
    total = every.sum().item()
    rows = [torch.zeros_like(x) for _ in range(n)]
    out = torch.zeros_like(x)

    def reduce() -> bool:
        z = x.clone()
        dist.reduce(z, dst=0)
        return r != 0 or z.item() == total

    def all_reduce() -> bool:
        z = x.clone()
        dist.all_reduce(z)
        return z.item() == total

    def all_gather() -> bool:
        dist.all_gather(rows, x)
        return torch.equal(torch.cat(rows), every)

    def gather() -> bool:
        dist.gather(x, rows if r == 0 else None, dst=0)
        return r != 0 or torch.equal(torch.cat(rows), every)

    def scatter() -> bool:
        dist.scatter(out, list(every.chunk(n)) if r == 0 else None, src=0)
        return out.item() == r + 1

    def reduce_scatter() -> bool:
        dist.reduce_scatter(out, list(every.chunk(n)))  # block r: r + 1 from all n
        return out.item() == n * (r + 1)

    def all_to_all() -> bool:
        dist.all_to_all(rows, list((every + 10 * r).chunk(n)))  # block j: j+1 + 10r
        return torch.equal(torch.cat(rows), (every - 1) * 10 + r + 1)

    def broadcast() -> bool:
        z = x.clone()
        dist.broadcast(z, src=0)
        return z.item() == 1

    def barrier() -> bool:
        dist.barrier()
        return True

    return {
        "send+recv": lambda: _send_recv(x, r, n),
        "broadcast": broadcast,
        "all_reduce": all_reduce,
        "reduce": reduce,
        "all_gather": all_gather,
        "gather": gather,
        "scatter": scatter,
        "reduce_scatter": reduce_scatter,
        "all_to_all": all_to_all,
        "barrier": barrier,
    }


def try_each() -> dict[str, str]:
    """Run every operation of OPS on this group; ✓ where it ran and gave the right
    result on every rank, else ✘. Every rank calls it and gets the same answer.

    A RuntimeError (an operation the backend lacks fails locally, on every rank) is
    caught and gives ✘. send and recv are tried together, round a ring of the ranks.
    """
    runtime.require_initialized()
    r, n = dist.get_rank(), dist.get_world_size()
    if n < 2:
        raise ValueError("try_each needs at least 2 ranks, to send and receive")
    x = torch.tensor([r + 1.0], device=runtime.device())
    found: dict[str, str] = {}
    for name, case in _cases(x, r, n).items():
        try:
            ok = bool(case())
        except RuntimeError:
            ok = False
        flag = torch.tensor([float(ok)], device=x.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)  # ✓ only if right on every rank
        for op in name.split("+"):
            found[op] = "✓" if flag.item() == 1 else "✘"
    return found


def table(measured: dict[str, str], column: str) -> str:
    """A text table: `measured` (from try_each) as `column`, then DOCS' columns.

    Column headers take three lines, e.g. "gloo / CPU / (run)": the measured column
    is marked "(run)", the cited ones "(docs)". Where the docs have a column of the
    same name, a last line says on how many operations run and docs agree.
    """
    cited = [c for c in DOCS if c != column]
    heads = [[*column.split(" ", 1), "(run)"]] + [[*c.split(), "(docs)"] for c in cited]
    width = max(len(word) for head in heads for word in head) + 2
    rows = [
        [first, *(h[k] if k < len(h) else "" for h in heads)]
        for k, first in enumerate(("", "", "operation"))
    ]
    rows += [
        [op, measured[op], *(DOCS[c][i] for c in cited)] for i, op in enumerate(OPS)
    ]
    widths, align = [16] + [width] * len(heads), "<" + "^" * len(heads)
    lines = [tables.aligned(rows, widths, align, gaps=0)]
    if column in DOCS:
        same = sum(measured[op] == DOCS[column][i] for i, op in enumerate(OPS))
        lines.append(f"{column}: run and docs agree on {same} of {len(OPS)} operations")
    return "\n".join(lines)
