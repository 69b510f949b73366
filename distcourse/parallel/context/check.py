"""The checks chapter 12b prints, in one place, so its controls can rerun them.

Each runs ring attention (or a replacement, to plant a fault) on seeded inputs that
every rank draws alike, and compares it with one process's
`F.scaled_dot_product_attention` on the whole sequence: the output and the
gradients of q, k and v, this rank's tokens against the same tokens of the whole,
the largest difference over every rank. `wire_and_memory` measures what one call
sends and keeps for backward, next to the formulas of `cost`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from distcourse import checks, runtime
from distcourse.comm.agree import Group, members
from distcourse.comm.ledger import Ledger
from distcourse.parallel.context.cost import (
    ring_bytes,
    saved_bytes,
    saved_bytes_formula,
    work_blocks,
)
from distcourse.parallel.context.ring import Work, ring_attention
from distcourse.parallel.context.split import shard

Shape = tuple[int, int, int, int]  # (B, H, T, D) of the whole sequence
Attention = Callable[..., Tensor]


def inputs(
    shape: Shape, seed: int = 0, device: torch.device | str | None = None
) -> list[Tensor]:
    """q, k, v and an output weight w (for a loss sum(out * w)), whole, seeded:
    the same on every rank, drawn on the host and moved to `device` (default: the
    rank's)."""
    device = runtime.device() if device is None else device
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=gen).to(device) for _ in range(4)]


def against_full_attention(
    shape: Shape,
    group: Group = None,
    *,
    causal: bool = True,
    layout: str = "zigzag",
    attention: Attention = ring_attention,
    seed: int = 0,
) -> dict[str, float]:
    """max |ring - full| of out, dq, dk, dv over every rank (a collective)."""
    g = members(group, "against_full_attention")
    q, k, v, w = inputs(shape, seed)
    whole = [t.clone().requires_grad_() for t in (q, k, v)]
    full = F.scaled_dot_product_attention(*whole, is_causal=causal)
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
    attention: Attention = ring_attention,
) -> dict[str, tuple[int, int]]:
    """(measured, formula) on this rank for one call: wire bytes of forward and
    backward (`ledger`), bytes kept for backward (saved-tensor hooks), blocks of
    scores computed (`Work`)."""
    g = members(group, "wire_and_memory")
    B, H, T, D = shape
    q, k, v, w = (shard(t, 2, g.size, g.rank, layout) for t in inputs(shape))
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
        "kept": (kept, saved_bytes_formula(B, H, T, D, g.size)),
        "blocks": (work.blocks, work_blocks(g.size, g.rank, layout, causal)),
    }


def full_attention_kept(
    shape: Shape, causal: bool = True, device: torch.device | str | None = None
) -> int:
    """Bytes PyTorch's fused attention keeps for backward on one process, for the
    whole sequence, measured on `device` (default: the rank's). What the kernel
    keeps depends on the device (`cost.full_attention_formula`): the CPU's keeps
    exactly cp times what a rank of ring attention keeps, CUDA's more. No messages.
    """
    q, k, v, _ = (t.requires_grad_() for t in inputs(shape, device=device))

    def run(*qkv: Tensor) -> Tensor:
        return F.scaled_dot_product_attention(*qkv, is_causal=causal)

    return saved_bytes(run, q, k, v)
