"""Cut a sequential model into pipeline stages: by layer count, or by measured time.

Every rank builds the same full model and the same split, then keeps only its own
stages; so every rank also knows every stage's shapes, which lets the runner check
that stage s's output fits stage s + 1 before anything is sent.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from distcourse.arguments import positive_int
from distcourse.clock import DeviceTimer


def layers_of(model: nn.Module) -> list[nn.Module]:
    """The layers a split may cut between: the children of an nn.Sequential."""
    if not isinstance(model, nn.Sequential):
        raise TypeError(
            f"a pipeline splits an nn.Sequential, got {type(model).__name__}: "
            "write the model as nn.Sequential(...) of its blocks"
        )
    return list(model)


def check_count(layers: int, stages: int) -> None:
    """ValueError unless `stages` is a positive int no greater than `layers`."""
    positive_int(stages, "stages")
    if stages > layers:
        raise ValueError(
            f"cannot cut {layers} layers into {stages} stages: every stage needs at "
            "least one layer"
        )


def split_at(model: nn.Module, bounds: Sequence[int]) -> list[nn.Sequential]:
    """Stages from cut points: bounds [0, 2, 5] on 5 layers -> layers [0:2], [2:5]."""
    layers = layers_of(model)
    ok = list(bounds) == sorted(set(bounds)) and len(bounds) >= 2
    if not ok or bounds[0] != 0 or bounds[-1] != len(layers):
        raise ValueError(
            f"bounds {list(bounds)} must rise strictly from 0 to {len(layers)}"
        )
    return [
        nn.Sequential(*layers[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)
    ]


def split_by_count(model: nn.Module, stages: int) -> list[nn.Sequential]:
    """`stages` consecutive groups of layers, sizes differing by at most one."""
    n = len(layers_of(model))
    check_count(n, stages)
    bounds = [round(i * n / stages) for i in range(stages + 1)]
    return split_at(model, bounds)


def layer_times(
    model: nn.Module, sample: torch.Tensor, repeats: int = 3
) -> list[float]:
    """Seconds of forward + backward per layer on `sample`, the best of `repeats`."""
    best = [float("inf")] * len(layers_of(model))
    timer = DeviceTimer(sample.device)  # device time, not the queueing
    for _ in range(repeats):
        x = sample
        for i, layer in enumerate(model):
            x = x.detach().requires_grad_(x.is_floating_point())
            start = timer.stamp()
            y = layer(x)
            y.backward(torch.ones_like(y))
            best[i] = min(best[i], timer.seconds(start, timer.stamp()))
            x = y
    model.zero_grad(set_to_none=True)
    return best


def balance(times: Sequence[float], stages: int) -> list[int]:
    """Cut points minimising the slowest stage's total time (exact, by bisection
    over the answer with a greedy fill)."""
    check_count(len(times), stages)

    def cuts(limit: float) -> list[int] | None:
        bounds, total = [0], 0.0
        for i, t in enumerate(times):
            if total + t > limit and total > 0:
                bounds.append(i)
                total = 0.0
            total += t
        if len(bounds) > stages:
            return None
        # spare stages: split the largest groups further (never worse)
        while len(bounds) < stages:
            free = [i for i in range(1, len(times)) if i not in bounds]
            bounds = sorted(bounds + [free[0]])
        return bounds + [len(times)]

    lo, hi = max(times), sum(times)
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if cuts(mid) else (mid, hi)
    return cuts(hi)  # type: ignore[return-value]


def split_balanced(
    model: nn.Module, stages: int, times: Sequence[float]
) -> list[nn.Sequential]:
    """Stages of about equal time, given each layer's measured `times` (layer_times):
    the pipeline runs at the pace of its slowest stage.

    Timings differ between ranks: measure on one rank and share the numbers (e.g.
    dist.broadcast_object_list), or ranks may cut the model differently.
    """
    n = len(layers_of(model))
    if len(times) != n:
        raise ValueError(f"{len(times)} times for {n} layers")
    return split_at(model, balance(times, stages))
