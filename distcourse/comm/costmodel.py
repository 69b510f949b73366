"""The alpha-beta cost model: a message of n bytes takes alpha + beta * n seconds.

alpha is the fixed cost of one message (latency), beta the cost of one byte (1 /
bandwidth). `predict` gives each collective's steps, bytes and time under the model;
`measure` and `fit_alpha_beta` find alpha and beta on the ranks at hand.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from distcourse import runtime
from distcourse.arguments import positive_int
from distcourse.clock import DeviceTimer


@dataclass(frozen=True)
class Cost:
    """What one collective costs under the alpha-beta model."""

    steps: int  # message rounds one after another (each pays alpha)
    bytes_sent: float  # bytes sent by the busiest rank
    seconds: float  # predicted time on the critical path


def _ring_all_reduce(s: float, n: int, a: float, b: float) -> Cost:
    # reduce-scatter then all-gather: 2(N-1) steps, each moving one chunk of S/N
    return Cost(2 * (n - 1), 2 * (n - 1) / n * s, 2 * (n - 1) * (a + b * s / n))


def _naive_all_reduce(s: float, n: int, a: float, b: float) -> Cost:
    # the root receives N-1 whole tensors, then sends N-1 back, one after another
    return Cost(2 * (n - 1), (n - 1) * s, 2 * (n - 1) * (a + b * s))


def _ring_gather(s: float, n: int, a: float, b: float) -> Cost:
    # all-gather or reduce-scatter of S bytes in all: N-1 steps of S/N
    return Cost(n - 1, (n - 1) / n * s, (n - 1) * (a + b * s / n))


def _tree_broadcast(s: float, n: int, a: float, b: float) -> Cost:
    # the holders double each round; the source sends the whole tensor every round
    rounds = math.ceil(math.log2(n)) if n > 1 else 0
    return Cost(rounds, rounds * s, rounds * (a + b * s))


def _tree_all_reduce(s: float, n: int, a: float, b: float) -> Cost:
    # reduce up a binomial tree, broadcast down it: each way ceil(log2 N) rounds of S
    rounds = math.ceil(math.log2(n)) if n > 1 else 0
    return Cost(2 * rounds, rounds * s, 2 * rounds * (a + b * s))


MODELS: dict[str, Callable[[float, int, float, float], Cost]] = {
    "ring_all_reduce": _ring_all_reduce,
    "naive_all_reduce": _naive_all_reduce,
    "ring_all_gather": _ring_gather,
    "ring_reduce_scatter": _ring_gather,
    "tree_broadcast": _tree_broadcast,
    "tree_all_reduce": _tree_all_reduce,
}


def predict(
    collective: str,
    nbytes: float,
    world_size: int,
    alpha: float = 0.0,
    beta: float = 0.0,
) -> Cost:
    """Steps, bytes sent by the busiest rank, and time of `collective` on S=`nbytes`.

    S is the full tensor: the all-reduced tensor, the gathered output of an all-gather,
    the input of a reduce-scatter. With alpha = beta = 0 only steps and bytes matter.
    """
    if collective not in MODELS:
        raise ValueError(
            f"unknown collective {collective!r}; use one of {list(MODELS)}"
        )
    positive_int(world_size, "world_size")
    return MODELS[collective](nbytes, world_size, alpha, beta)


def sent_per_rank(collective: str, nbytes: int, world_size: int) -> list[int]:
    """Bytes each group rank sends in an all-reduce of `nbytes`, rank by rank.

    ring: 2(N-1)/N * S each (S a multiple of N elements); naive: (N-1) * S from the
    root, S from every other rank; tree: S up the tree from every rank but the root,
    then S in each broadcast round of mask 2**k where rank < 2**k and rank + 2**k
    < N (the root: ceil(log2 N) * S). What a Ledger must count on the real sends.
    """
    n, s = world_size, nbytes
    if collective == "ring_all_reduce":
        return [2 * (n - 1) * s // n] * n
    if collective == "naive_all_reduce":
        return [(n - 1) * s] + [s] * (n - 1)
    if collective == "tree_all_reduce":
        masks = [1 << k for k in range(max(n - 1, 0).bit_length())]
        down = [sum(r < m and r + m < n for m in masks) for r in range(n)]
        return [(d + (r != 0)) * s for r, d in enumerate(down)]
    raise ValueError(
        f"sent_per_rank knows ring_all_reduce, naive_all_reduce and "
        f"tree_all_reduce, not {collective!r}"
    )


_BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
}


def bus_bandwidth(
    nbytes: float, world_size: int, seconds: float, collective: str = "all_reduce"
) -> float:
    """Bus bandwidth in bytes/s: S / t scaled by the bytes a ring must move per rank.

    As in nccl-tests, it is comparable across world sizes and with a link's speed.
    """
    return _BUS_FACTOR[collective](world_size) * nbytes / seconds


def fit_alpha_beta(
    sizes_bytes: Sequence[float], times_s: Sequence[float], relative: bool = True
) -> tuple[float, float]:
    """Least-squares fit of t = alpha + beta * bytes; returns (alpha, beta).

    With `relative`, each point is weighted by 1/t, so the small messages that fix
    alpha count as much as the large ones that fix beta.
    """
    s = np.asarray(sizes_bytes, dtype=float)
    t = np.asarray(times_s, dtype=float)
    if s.shape != t.shape or s.size < 2:
        raise ValueError("need at least two (size, time) pairs of equal length")
    design = np.stack([np.ones_like(s), s], axis=1)  # (points, 2): [1, bytes]
    weight = 1 / t if relative else np.ones_like(t)
    (alpha, beta), *_ = np.linalg.lstsq(
        design * weight[:, None], t * weight, rcond=None
    )
    return float(alpha), float(beta)


def fit_collective(
    collective: str,
    sizes_bytes: Sequence[float],
    times_s: Sequence[float],
    world_size: int,
    beta: bool = True,
) -> tuple[float, float]:
    """alpha and beta that make `predict(collective, ...)` fit measured times best.

    The model is linear in alpha and beta: t = steps * alpha + k(S) * beta, where
    k(S) is the predicted time with alpha = 0 and beta = 1. A relative least-squares
    fit (each point weighted by 1/t, as in fit_alpha_beta) of the collective's own
    times, on the ranks it ran on, gives the alpha and beta of those conditions.
    `beta=False` fits alpha alone (beta = 0): a model whose time does not grow with
    the bytes, the wrong model a held-out check must be able to reject.
    """
    s = np.asarray(sizes_bytes, dtype=float)
    t = np.asarray(times_s, dtype=float)
    if s.shape != t.shape or s.size < 2:
        raise ValueError("need at least two (size, time) pairs of equal length")
    steps = [predict(collective, x, world_size, 1.0, 0.0).seconds for x in s]
    per_byte = [predict(collective, x, world_size, 0.0, 1.0).seconds for x in s]
    columns = [steps, per_byte] if beta else [steps]
    design = np.stack(columns, axis=1) / t[:, None]  # (points, 2 or 1)
    coef, *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
    return float(coef[0]), float(coef[1]) if beta else 0.0


def held_out(
    collective: str,
    sizes_bytes: Sequence[float],
    times_s: Sequence[float],
    world_size: int,
    fit_at: Sequence[int],
    check_at: Sequence[int],
    factor: float = 3.0,
    beta: bool = True,
) -> tuple[float, float, str]:
    """Fit at the sizes `fit_at`, predict those at `check_at`: (alpha, beta, verdict).

    The verdict is `within_factor` of the predictions and the measured times at the
    held-out sizes. It can fail only if the held-out sizes include one where the
    bytes term dominates (its time several times the smallest size's), and the fit
    includes a larger one: then a model without beta (`beta=False`) misses it.
    """
    if set(fit_at) & set(check_at):
        raise ValueError(f"fit_at {list(fit_at)} and check_at {list(check_at)} overlap")
    a, b = fit_collective(
        collective,
        [sizes_bytes[i] for i in fit_at],
        [times_s[i] for i in fit_at],
        world_size,
        beta=beta,
    )
    guess = [
        predict(collective, sizes_bytes[i], world_size, a, b).seconds for i in check_at
    ]
    return a, b, within_factor(guess, [times_s[i] for i in check_at], factor)


def within_factor(
    predicted: Sequence[float], measured: Sequence[float], factor: float
) -> str:
    """Does every prediction lie within `factor` of its measurement, either way?

    A verdict as text that does not change with the timings while it holds, for
    stored notebook output: 'within a factor 3: PASS'. A FAIL shows the worst ratio;
    a time that is not positive (a fit with a negative alpha can predict one) fails.
    """
    if not factor > 1:
        raise ValueError(f"factor must be above 1, got {factor}")
    pairs = zip(predicted, measured, strict=True)
    ratios = [max(p / m, m / p) if p > 0 and m > 0 else math.inf for p, m in pairs]
    worst = max(ratios, default=1.0)
    if worst <= factor:
        return f"within a factor {factor:g}: PASS"
    return f"off by a factor {worst:.1f} > {factor:g}: FAIL"


def measure(
    fn: Callable[[torch.Tensor], object] | dict[str, Callable[[torch.Tensor], object]],
    sizes: Sequence[int],
    repeats: int = 5,
    warmup: int = 1,
    dtype: torch.dtype = torch.float32,
    group: dist.ProcessGroup | None = None,
    spread: bool = False,
) -> list | dict[str, list]:
    """Seconds per call of a collective `fn(tensor)`, for tensors of each size in bytes.

    Every rank must call it. Each timing starts after a barrier; a size's time is the
    median of `repeats`, then the maximum over ranks (the slowest rank sets the pace).
    With `spread`, a size's entry is instead the sorted list of all `repeats` times,
    each the slowest rank's, to show how much they vary. Pass a dict of functions to
    time them alternately on the same tensors.
    """
    runtime.require_initialized()
    fns = fn if isinstance(fn, dict) else {"fn": fn}
    device = runtime.device()
    item = torch.empty((), dtype=dtype).element_size()
    times: dict[str, list] = {name: [] for name in fns}
    for size in sizes:
        x = torch.zeros(max(size // item, 1), dtype=dtype, device=device)
        runs: dict[str, list[float]] = {name: [] for name in fns}
        timer = DeviceTimer(device)  # device time: synchronized or CUDA events
        for rep in range(warmup + repeats):
            for name, f in fns.items():
                dist.barrier(group=group)
                start = timer.stamp()
                f(x)
                if rep >= warmup:
                    runs[name].append(timer.seconds(start, timer.stamp()))
        for name in fns:
            mine = runs[name] if spread else [statistics.median(runs[name])]
            slowest = torch.tensor(mine, dtype=torch.float64, device=device)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
            got = sorted(slowest.tolist())
            times[name].append(got if spread else got[0])
    return times if isinstance(fn, dict) else times["fn"]
