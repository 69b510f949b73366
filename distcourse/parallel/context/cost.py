"""What ring and Ulysses attention cost one rank: wire bytes, memory kept, work.

**Bytes** (the book's convention: what this rank puts on the wire). Every pass of
the ring is one `p2p.send_recv` to the right: the data, plus a 80-byte header this
rank sends as sender and an 80-byte ack it sends as receiver. With X the bytes of
this rank's K (= of its V), B·H·(T/cp)·D values:

    forward    cp − 1 passes of K and V                 (cp − 1)(2X + 160)
    backward   cp − 1 passes of K, V, dK, dV            (cp − 1)(4X + 160)
               and one pass of dK, dV to their owner    + 2X + 160
    check      one all_gather of 112 bytes (agree)      112 (cp − 1)

Under grouped-query attention X is K's bytes with its Hkv heads: only they travel.
Ulysses (`ulysses.py`) moves, with X_q the bytes of this rank's q, in four
all_to_alls (each sends the (cp − 1)/cp of its input addressed to other ranks):

    forward    q, k, v in; out back                     (2X_q + 2X)(cp − 1)/cp
    backward   dout in; dq, dk, dv back                 (2X_q + 2X)(cp − 1)/cp
    sizes      two all_gathers of one int64 (forward)   2 · 8 (cp − 1)
    check      as above                                 112 (cp − 1)

Data alone: ring 6(cp − 1)X + 2X, growing with cp; Ulysses 4(X_q + X)(cp − 1)/cp,
under 4(X_q + X) at any cp. With H = Hkv (X_q = X) Ulysses sends less from cp = 2 on
(8X·½ = 4X against 8X); under GQA with X_q = g·X it sends more while
4(g + 1)(cp − 1)/cp > 6cp − 4, at small cp and large g.

**Memory kept for backward** (what the saved-tensor hooks see): q, k, v, out and one
log-sum-exp per head and token, this rank's T/cp tokens only:
(4·B·H·(T/cp)·D + B·H·T/cp) values, on any device (the ring is ours, not a
kernel's). That is exactly 1/cp of what PyTorch's fused attention keeps on one
process for the whole sequence on the CPU (q, k, v, out, lse). With Hkv K/V heads,
k and v count Hkv heads. Ulysses keeps the same count: q, k, v, out and lse of all T
tokens of its H/cp heads (and Hkv/cp K/V heads), saved by SDPA's CPU kernel.
CUDA's kernel keeps more (`full_attention_formula`): fp32 runs its memory-efficient
kernel, whose log-sum-exp is padded to a multiple of 32 tokens, plus its
random-number state. Not kept, but alive during a step: the ring's K/V message in
use and the one arriving (4X bytes in the forward; in the backward, with dK and dV,
8X); Ulysses's q, k, v of its heads before and after the all_to_all (2(X_q + 2X)),
and its kernel's scores for the whole sequence unless the kernel is a flash one.

**Work**: blocks of c x c scores, c = T/(2·cp). The whole causal matrix has
2cp(2cp + 1)/2 blocks that are not entirely masked. Rank r computes, for its query
chunks i, the i + 1 blocks of keys at or before them: chunks 2r and 2r + 1
("contiguous") give 4r + 3 blocks, from 3 on rank 0 to 4cp − 1 on the last; chunks
r and 2cp − 1 − r ("zigzag") give 2cp + 1 on every rank. Without a causal mask each
rank computes 4cp.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from distcourse import accelerator, sdpa
from distcourse.comm.p2p import HEADER_LEN
from distcourse.parallel.context.split import chunk_ids

HANDSHAKE = 2 * HEADER_LEN * 8  # bytes this rank sends per pass: header and ack
AGREE = 112  # the agreement row: 14 int64


def ring_bytes(
    kv_bytes: int, cp: int, *, backward: bool = True, check: bool = True
) -> int:
    """Wire bytes one rank sends for one ring attention call (module docstring);
    `kv_bytes` is this rank's K alone (B·H·(T/cp)·D times the value's bytes)."""
    if cp == 1:
        return 0
    total = (cp - 1) * (2 * kv_bytes + HANDSHAKE)
    if backward:
        total += (cp - 1) * (4 * kv_bytes + HANDSHAKE) + 2 * kv_bytes + HANDSHAKE
    return total + (AGREE * (cp - 1) if check else 0)


def ulysses_bytes(q_bytes: int, kv_bytes: int, cp: int, *, check: bool = True) -> int:
    """Wire bytes one rank sends for one Ulysses call, forward and backward (module
    docstring); `q_bytes`, `kv_bytes`: this rank's q and its K alone."""
    if cp == 1:
        return 0
    data = 4 * (q_bytes + kv_bytes) * (cp - 1) // cp
    return data + 2 * 8 * (cp - 1) + (AGREE * (cp - 1) if check else 0)


def saved_bytes_formula(
    batch: int,
    heads: int,
    seq: int,
    head_dim: int,
    cp: int,
    value_bytes: int = 4,
    kv_heads: int | None = None,
) -> int:
    """Bytes one rank keeps for backward: q, k, v, out and lse of T/cp tokens (or,
    for Ulysses, of T tokens and 1/cp of the heads: the same count); k and v have
    `kv_heads` heads (default: `heads`)."""
    kv_heads = heads if kv_heads is None else kv_heads
    tokens, kv_tokens = batch * heads * (seq // cp), batch * kv_heads * (seq // cp)
    return (2 * (tokens + kv_tokens) * head_dim + tokens) * value_bytes


def full_attention_formula(
    batch: int, heads: int, seq: int, head_dim: int, device_type: str = "cpu"
) -> int:
    """Bytes PyTorch's attention (`F.scaled_dot_product_attention`, fp32, causal)
    keeps for backward on one process, for the whole sequence, on a device of
    `device_type`: q, k, v, out, and what the kernel torch runs there keeps
    (`distcourse.sdpa`, the one place the choice is written):

    - on the CPU (`_scaled_dot_product_flash_attention_for_cpu`): one log-sum-exp
      per head and token, measured by the tests and the chapter;
    - on a GPU (CUDA's, or the emulated one, which chooses as CUDA does): fp32 runs
      the memory-efficient kernel where the head size divides by 4 (FlashAttention
      and cuDNN's take only fp16 and bf16): its log-sum-exp, float32, padded to a
      multiple of 32 tokens, and its random-number state, a seed and an offset
      (two int64), as torch's shape function says; a smaller head size runs the
      math path, which keeps the s x s scores and no output of its own.
    """
    kernel = sdpa.choose_kernel(
        accelerator.kernel_type(device_type),
        torch.float32,
        head_dim,
        causal=True,
        enabled=frozenset(sdpa.KERNELS),
    )
    kept = sdpa.saved_bytes(kernel, batch, heads, seq, head_dim, torch.float32)
    tensors = 3 if kernel == "math" else 4  # q, k, v (and out, for a fused kernel)
    return tensors * batch * heads * seq * head_dim * 4 + sum(kept.values())


def saved_bytes(fn: Callable[..., Tensor], *args: Tensor) -> int:
    """Bytes autograd keeps for backward while `fn(*args)` runs (forward only).

    Each storage the ops save is counted once, whole; the graph is dropped after.
    Pass inputs as tensors of their own: a view holds its whole storage.
    """
    seen: set[int] = set()
    total = [0]

    def pack(t: Tensor) -> Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen and storage.nbytes():
            seen.add(storage.data_ptr())
            total[0] += storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*args)
    return total[0]


def work_blocks(cp: int, rank: int, layout: str = "zigzag", causal: bool = True) -> int:
    """Blocks of c x c scores rank `rank` computes in its forward (module docstring)."""
    if not causal:
        return 4 * cp
    return sum(i + 1 for i in chunk_ids(cp, rank, layout))


def imbalance(cp: int, layout: str = "zigzag", causal: bool = True) -> float:
    """The busiest rank's blocks over the mean: 1.0 is balanced. The ring runs at
    the pace of the busiest rank, so this is the time lost to waiting."""
    blocks = [work_blocks(cp, r, layout, causal) for r in range(cp)]
    return max(blocks) * cp / sum(blocks)
