"""The checks chapter 12b prints, in one place, so its controls can rerun them.

Each runs ring attention (or a replacement, to plant a fault) on seeded inputs that
every rank draws alike, and compares it with one process's
`F.scaled_dot_product_attention` on the whole sequence: the output and the
gradients of q, k and v, this rank's tokens against the same tokens of the whole,
the largest difference over every rank. `wire_and_memory` measures what one call
sends and keeps for backward, next to the formulas of `cost`; `ulysses_cost` the
same for Ulysses; `timings` times ring, Ulysses and one process. `kv_heads` (default:
q's heads) gives k and v fewer heads (grouped-query attention); the reference is then
SDPA with enable_gqa=True.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from distcourse import accelerator, checks, clock, runtime, sdpa
from distcourse.comm.agree import Group, members
from distcourse.comm.ledger import Ledger
from distcourse.parallel.context.cost import (
    ring_bytes,
    saved_bytes,
    saved_bytes_formula,
    ulysses_bytes,
    work_blocks,
)
from distcourse.parallel.context.ring import Work, ring_attention
from distcourse.parallel.context.split import shard
from distcourse.parallel.context.ulysses import ulysses_attention

Shape = tuple[int, int, int, int]  # (B, H, T, D) of the whole sequence
Attention = Callable[..., Tensor]


def inputs(
    shape: Shape,
    seed: int = 0,
    device: torch.device | str | None = None,
    kv_heads: int | None = None,
) -> list[Tensor]:
    """q, k, v and an output weight w (for a loss sum(out * w)), whole, seeded:
    the same on every rank, drawn on the host and moved to `device` (default: the
    rank's); k and v with `kv_heads` heads."""
    device = runtime.device() if device is None else device
    gen = torch.Generator().manual_seed(seed)
    B, H, T, D = shape
    kv = (B, H if kv_heads is None else kv_heads, T, D)
    shapes = [shape, kv, kv, shape]
    return [torch.randn(s, generator=gen).to(device) for s in shapes]


def against_full_attention(
    shape: Shape,
    group: Group = None,
    *,
    causal: bool = True,
    layout: str = "zigzag",
    attention: Attention | None = None,
    seed: int = 0,
    kv_heads: int | None = None,
) -> dict[str, float]:
    """max |ring - full| of out, dq, dk, dv over every rank (a collective)."""
    attention = attention or ring_attention  # looked up now: a control plants one
    g = members(group, "against_full_attention")
    q, k, v, w = inputs(shape, seed, kv_heads=kv_heads)
    whole = [t.clone().requires_grad_() for t in (q, k, v)]
    gqa = {"enable_gqa": True} if k.size(1) != q.size(1) else {}
    full = F.scaled_dot_product_attention(*whole, is_causal=causal, **gqa)
    (full * w).sum().backward()

    def mine(t: Tensor) -> Tensor:
        return shard(t, 2, g.size, g.rank, layout)

    local = [mine(t).requires_grad_() for t in (q, k, v)]
    out = attention(*local, group, causal=causal, layout=layout)
    (out * mine(w)).sum().backward()
    pairs = {"out": (out, full)}
    pairs |= {
        f"d{n}": (a.grad, b.grad) for n, a, b in zip("qkv", local, whole, strict=True)
    }
    diffs = {n: (a - mine(b)).abs().max().item() for n, (a, b) in pairs.items()}
    return {n: checks.max_over_ranks(d) for n, d in diffs.items()}


def wire_and_memory(
    shape: Shape,
    group: Group = None,
    *,
    causal: bool = True,
    layout: str = "zigzag",
    attention: Attention | None = None,
    kv_heads: int | None = None,
) -> dict[str, tuple[int, int]]:
    """(measured, formula) on this rank for one call: wire bytes of forward and
    backward (`ledger`), bytes kept for backward (saved-tensor hooks), blocks of
    scores computed (`Work`)."""
    attention = attention or ring_attention  # looked up now: a control plants one
    g = members(group, "wire_and_memory")
    B, H, T, D = shape
    whole = inputs(shape, kv_heads=kv_heads)
    q, k, v, w = (shard(t, 2, g.size, g.rank, layout) for t in whole)
    local = [t.requires_grad_() for t in (q, k, v)]
    work = Work()

    def run(*qkv: Tensor) -> Tensor:
        return attention(*qkv, group, causal=causal, layout=layout, work=work)

    kept = saved_bytes(run, *local)  # a forward alone: its graph is dropped
    work.blocks = 0
    with Ledger() as ledger:
        (run(*local) * w).sum().backward()
    kv = k.numel() * k.element_size()
    return {
        "wire": (ledger.bytes_sent(), ring_bytes(kv, g.size)),
        "kept": (kept, saved_bytes_formula(B, H, T, D, g.size, kv_heads=k.size(1))),
        "blocks": (work.blocks, work_blocks(g.size, g.rank, layout, causal)),
    }


def full_attention_kept(
    shape: Shape,
    causal: bool = True,
    device: torch.device | str | None = None,
    kv_heads: int | None = None,
) -> int:
    """Bytes PyTorch's fused attention keeps for backward on one process, for the
    whole sequence, measured on `device` (default: the rank's). What the kernel
    keeps depends on the device (`cost.full_attention_formula`): the CPU's keeps
    exactly cp times what a rank of ring attention keeps, CUDA's more. No messages.
    """
    made = inputs(shape, device=device, kv_heads=kv_heads)
    q, k, v, _ = (t.requires_grad_() for t in made)
    gqa = {"enable_gqa": True} if k.size(1) != q.size(1) else {}

    def run(*qkv: Tensor) -> Tensor:
        return F.scaled_dot_product_attention(*qkv, is_causal=causal, **gqa)

    return saved_bytes(run, q, k, v)


def _rng_state_bytes(q: Tensor, causal: bool) -> int:
    """Bytes of random-number state one SDPA call keeps on q's device: CUDA's fused
    kernels keep a seed and an offset per call (`distcourse.sdpa`), the CPU's none."""
    kernel = sdpa.choose_kernel(
        accelerator.kernel_type(q.device), q.dtype, q.size(-1), causal=causal
    )
    kept = sdpa.saved_bytes(kernel, 1, 1, 1, q.size(-1), q.dtype)
    return kept.get("seed", 0) + kept.get("offset", 0)


def ulysses_cost(
    shape: Shape,
    group: Group = None,
    *,
    kv_heads: int | None = None,
    causal: bool = True,
    attention: Attention | None = None,
) -> dict[str, tuple[int, int]]:
    """(measured, formula) on this rank for one Ulysses call: wire bytes of forward
    and backward (`ledger`, all_to_alls counted from their pieces), bytes kept for
    backward (the formula is the CPU kernel's count); "share": cp times the bytes
    kept against what SDPA keeps on one process for the whole sequence, both on the
    rank's device (its kernel decides), plus the random-number state each further
    call keeps (a seed and an offset on a GPU, none on the CPU); "ring": ring
    attention's wire bytes by formula, against Ulysses's."""
    attention = attention or ulysses_attention  # looked up now: a control plants one
    g = members(group, "ulysses_cost")
    B, H, T, D = shape
    whole = inputs(shape, kv_heads=kv_heads)
    q, k, v, w = (shard(t, 2, g.size, g.rank) for t in whole)
    local = [t.requires_grad_() for t in (q, k, v)]

    def run(*qkv: Tensor) -> Tensor:
        return attention(*qkv, group, causal=causal)

    kept = saved_bytes(run, *local)
    with Ledger() as ledger:
        (run(*local) * w).sum().backward()
    size = [t.numel() * t.element_size() for t in (q, k)]
    return {
        "wire": (ledger.bytes_sent(), ulysses_bytes(*size, g.size)),
        "kept": (kept, saved_bytes_formula(B, H, T, D, g.size, kv_heads=k.size(1))),
        "share": (
            kept * g.size,  # each of the cp calls keeps its kernel's own RNG state
            full_attention_kept(shape, causal, None, kv_heads)
            + (g.size - 1) * _rng_state_bytes(q, causal),
        ),
        "ring": (ring_bytes(size[1], g.size), ulysses_bytes(*size, g.size)),
    }


def timings(
    shape: Shape,
    group: Group = None,
    *,
    kv_heads: int | None = None,
    repeats: int = 3,
) -> dict[str, float]:
    """Seconds of one causal forward and backward, the best of `repeats`: ring and
    Ulysses on every rank of `group` (the slowest rank), and SDPA of the whole
    sequence on this rank alone (the ranks take turns: one at a time, as if alone)."""
    g = members(group, "timings")
    whole = [t.requires_grad_() for t in inputs(shape, kv_heads=kv_heads)[:3]]
    local = [shard(t, 2, g.size, g.rank).detach().requires_grad_() for t in whole]
    gqa = whole[1].size(1) != whole[0].size(1)

    def one(fn: Callable[[], Tensor]) -> float:
        return min(clock.timed(lambda: fn().sum().backward()) for _ in range(repeats))

    took = {
        "ring": one(lambda: ring_attention(*local, group)),
        "ulysses": one(lambda: ulysses_attention(*local, group)),
    }
    took = {n: checks.max_over_ranks(t) for n, t in took.items()}

    def sdpa() -> Tensor:
        return F.scaled_dot_product_attention(*whole, is_causal=True, enable_gqa=gqa)

    alone = 0.0
    for r in range(g.size):  # one rank at a time, the others wait at the barrier
        if r == g.rank:
            alone = one(sdpa)
        torch.distributed.barrier(group)
    took["one process"] = checks.max_over_ranks(alone)
    return took
