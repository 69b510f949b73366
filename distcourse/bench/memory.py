"""`python -m distcourse.bench memory`: what data parallelism costs in memory, per rank.

Every rank holds the whole model (P parameters), its gradients, DDP's buckets (one
flat copy of the gradients, for the all-reduce) and the optimizer's state (Adam: two
numbers per parameter). In float32 that is 4 bytes x P x (1 + 1 + 1 + 2) = 20 P bytes.
With `gradient_as_bucket_view=True` the gradients are views into the buckets, so one
term goes: 16 P. We count the bytes of the distinct tensor storages each part holds
after a training step (views share a storage, so nothing is counted twice) and
compare them with the formula, for torch's DDP and ours. torch's buckets are not
public: a comm hook sees each one (`GradBucket.buffer()`) as it is all-reduced.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from distcourse import runtime, tables
from distcourse.examples import models
from distcourse.launch import spawn
from distcourse.parallel.ddp import DDP

PARTS = ("replica", "gradients", "buckets", "optimizer")
ADAM_STATES = ("exp_avg", "exp_avg_sq")  # one number per parameter each


def held_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind `tensors` (a view adds nothing)."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage() for t in tensors}
    return sum(s.nbytes() for s in storages.values())


def formula(parameters: int, gradient_as_bucket_view: bool) -> dict[str, int]:
    """Bytes per part in float32: 4 P each, Adam 8 P, gradients 0 P as bucket views."""
    grads = 0 if gradient_as_bucket_view else 4 * parameters
    return dict(
        replica=4 * parameters,
        gradients=grads,
        buckets=4 * parameters,
        optimizer=8 * parameters,
    )


def measure(impl: str, gradient_as_bucket_view: bool, width: int = 256) -> dict:
    """On every rank: bytes held per part after 3 Adam steps of `wide_mlp`."""
    torch.manual_seed(0)
    device = runtime.device()  # the rank's own: a GPU on a GPU box
    model = models.wide_mlp(width=width, depth=3, d_in=64).to(device)
    if impl == "torch":
        net = DistributedDataParallel(
            model, gradient_as_bucket_view=gradient_as_bucket_view
        )
        seen: dict[int, torch.Tensor] = {}

        def record(state, bucket):  # no annotations: torch checks them as objects
            seen[bucket.index()] = bucket.buffer()
            return allreduce_hook(None, bucket)  # type: ignore[arg-type]

        net.register_comm_hook(None, record)
    else:
        net = DDP(model, gradient_as_bucket_view=gradient_as_bucket_view)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(16, 64).to(device)
    y = torch.randint(0, 10, (16,)).to(device)
    for _ in range(3):  # torch rebuilds its buckets after the first step
        optimizer.zero_grad()
        F.cross_entropy(net(x), y).backward()
        optimizer.step()
    params = list(model.parameters())
    grads = [p.grad for p in params if p.grad is not None]
    buckets = (
        list(seen.values()) if impl == "torch" else [b.buffer for b in net.buckets]
    )
    states = [optimizer.state[p][k] for p in params for k in ADAM_STATES]
    held = dict(
        replica=held_bytes(params),
        gradients=held_bytes(params + buckets + grads) - held_bytes(params + buckets),
        buckets=held_bytes(buckets),
        optimizer=held_bytes(states),
    )
    return dict(held=held, parameters=models.count_parameters(model))


def _measure_all(width: int) -> list[dict]:
    return [
        dict(impl=impl, view=view, **measure(impl, view, width))
        for impl in ("torch", "ours")
        for view in (False, True)
    ]


def run(width: int = 256) -> list[dict]:
    """Both DDPs, with and without gradient_as_bucket_view, on 2 ranks (rank 0's)."""
    rows = spawn(_measure_all, 2, width)[0]
    for row in rows:
        row["expected"] = formula(row["parameters"], row["view"])
    return rows


def format_table(rows: list[dict]) -> str:
    """Measured bytes per part in MB (10**6 bytes); do they equal the formula?"""
    lines = [("DDP", "as view", *PARTS, "total", "= formula")]
    for r in rows:
        held = r["held"]
        megabytes = [f"{held[p] / 1e6:.2f} MB" for p in PARTS]
        total = f"{sum(held.values()) / 1e6:.2f} MB"
        lines.append((r["impl"], r["view"], *megabytes, total, held == r["expected"]))
    return tables.aligned(
        lines,
        widths=(6, 8, *[11] * len(PARTS), 9, 0),
        align="<<" + ">" * (len(PARTS) + 1),
        gaps=(1, *[0] * len(PARTS), 0, 2),
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m distcourse.bench memory")
    parser.add_argument("--width", type=int, default=256)
    print(format_table(run(parser.parse_args(argv).width)))
    return 0
