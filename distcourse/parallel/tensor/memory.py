"""Activation memory of a transformer block: measured with saved-tensor hooks, and
the formula it must equal, with and without tensor and sequence parallelism.

What autograd keeps between forward and backward is what every op saves for its
backward. `saved_activation_bytes` runs a forward inside
`torch.autograd.graph.saved_tensors_hooks` and adds up the distinct storages the ops
save, leaving out parameters (weights are not activations), by the block's
sub-layer (`ln1`, `attn`, `ln2`, `mlp`).

`block_activation_bytes` is Korthikanti et al. 2022's count (Reducing Activation
Recomputation in Large Transformer Models, section 4), sbh(34 + 5as/h) bytes at 16
bits with dropout, redone for `examples.gpt.Block` as it runs here: 32-bit values,
dropout 0 (no masks are saved), layer norms that save their mean and 1/std (two
values per token), and PyTorch's fused attention, which saves its output and one
log-sum-exp per head and token instead of the s x s score matrices (the 5as/h term).
Per token, with h the width, a the heads and t the tensor-parallel size:

    sub-layer  saves                                          values per token
    ln1, ln2   input, mean, 1/std                             h + 2 each
    attn       q/k/v input; q, k, v; output (= proj input);   h + (4h + a) / t
               log-sum-exp
    mlp        fc input; GELU input; proj input               h + 8h / t

Without tensor parallelism (t = 1) that is 16h + a + 4 values per token. With
sequence parallelism the norms run on s / t tokens, so their h + 2 divide by t; the
column layers' inputs stay whole, because ours keep the all-gathered input for
backward, where Megatron-LM keeps its own part and gathers it again (the paper's
34/t divides everything).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from distcourse.comm.agree import Group, members


def block_memory(
    block: nn.Module,
    twin: nn.Module,
    x: Tensor,
    group: Group = None,
    *,
    sequence_parallel: bool = False,
) -> tuple[dict[str, int], dict[str, int]]:
    """(measured, formula): bytes `twin` keeps for backward on this rank, by sub-layer.

    `twin` is `block` split over `group` (as `parallelize_block` splits it), or
    `block` itself for one process (t = 1). `x` is the whole (B, T, C) input; with
    sequence_parallel, this rank runs on its part of the tokens, as a tensor of its
    own (as a reduce_scatter leaves it). The formula is `block_activation_bytes`
    for `block`'s width and heads. No messages beyond the twin's own.
    """
    tp = members(group, "block_memory") if twin is not block else None
    t, rank = (tp.size, tp.rank) if tp else (1, 0)
    B, T, C = x.shape
    options = dict(sequence_parallel=sequence_parallel, device_type=x.device.type)
    # first the formula: it refuses sizes that do not split, before any collective
    formula = block_activation_bytes(B, T, C, block.attn.n_head, t, **options)
    if sequence_parallel:
        x = x.tensor_split(t, 1)[rank].contiguous()  # (B, T / t, C): my tokens
    measured = saved_activation_bytes(twin, x.detach().requires_grad_())
    return measured, formula


def saved_activation_bytes(block: nn.Module, x: Tensor) -> dict[str, int]:
    """Bytes autograd keeps for backward during `block(x)`, by top-level sub-module.

    Each storage is counted once (query, key and value save the same input), with
    its whole size, credited to the sub-module whose forward saved it first;
    parameters are left out. A view holds its whole storage, so pass x as a tensor
    of its own (a slice of a larger x would count all of it). Only the forward runs;
    the graph is dropped after.
    """
    params = {p.untyped_storage().data_ptr() for p in block.parameters()}
    seen: set[int] = set()
    counts: dict[str, int] = {name: 0 for name, _ in block.named_children()}
    counts["(block)"] = 0
    where = ["(block)"]

    def pack(t: Tensor) -> Tensor:
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key not in params and key not in seen and storage.nbytes():
            seen.add(key)
            counts[where[-1]] += storage.nbytes()
        return t

    with _tracking(block, where):
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            block(x)
    return {k: v for k, v in counts.items() if v or k != "(block)"}


def step_activation_bytes(
    model: nn.Module, loss_of: Callable[[nn.Module], Tensor]
) -> int:
    """Bytes autograd keeps for backward during `loss_of(model)`, a whole forward
    and its loss: each storage once, parameters left out (as
    `saved_activation_bytes`, without the split by sub-module). Pass inputs as
    tensors of their own: a slice would count its whole storage."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: Tensor) -> Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss_of(model)
    return sum(seen.values())


@contextmanager
def _tracking(block: nn.Module, where: list[str]) -> Iterator[None]:
    """Keep `where[-1]` the name of the child of `block` whose forward is running."""

    def leave(*_: object) -> None:  # a hook that returns a value replaces the output
        where.pop()

    handles = []
    for name, child in block.named_children():
        enter = functools.partial(_enter, where, name)
        handles.append(child.register_forward_pre_hook(enter))
        handles.append(child.register_forward_hook(leave))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _enter(where: list[str], name: str, *_: object) -> None:
    where.append(name)


def block_activation_bytes(
    batch: int,
    seq: int,
    width: int,
    heads: int,
    tp: int = 1,
    *,
    sequence_parallel: bool = False,
    value_bytes: int = 4,
    device_type: str = "cpu",
) -> dict[str, int]:
    """What one rank's `examples.gpt.Block` keeps for backward, by sub-layer (bytes).

    The table in this module's docstring, for a (batch, seq, width) input split `tp`
    ways (heads and width must divide by tp; with sequence_parallel, seq too).
    Measured on CPU, where the fused kernel keeps one log-sum-exp per head and
    token; on CUDA, `fused_attention_lse_bytes` says what its kernel keeps instead.
    """
    for name, value in (("heads", heads), ("width", width)):
        if value % tp:
            raise ValueError(f"{name}={value} is not divisible by tensor-parallel {tp}")
    if sequence_parallel and seq % tp:
        raise ValueError(f"seq={seq} is not divisible by tensor-parallel size {tp}")
    h, a, b, s = width, heads, batch, seq
    norm_tokens = b * s // tp if sequence_parallel else b * s
    norm = norm_tokens * (h + 2) * value_bytes
    attn = b * s * (h + 4 * h // tp) * value_bytes
    attn += fused_attention_lse_bytes(b, a // tp, s, value_bytes, device_type)
    mlp = b * s * (h + 8 * h // tp) * value_bytes
    return {"ln1": norm, "attn": attn, "ln2": norm, "mlp": mlp}


def fused_attention_lse_bytes(
    batch: int,
    heads: int,
    seq: int,
    value_bytes: int = 4,
    device_type: str = "cpu",
) -> int:
    """Bytes torch's fused attention keeps for backward besides q, k, v and its
    output, for `heads` heads of `seq` tokens.

    On the CPU (`_scaled_dot_product_flash_attention_for_cpu`): one log-sum-exp per
    head and token, `value_bytes` each (measured by the tests). On CUDA, fp32 inputs
    run the memory-efficient kernel: FlashAttention and cuDNN's take only fp16 and
    bf16 (pytorch/pytorch aten/src/ATen/native/transformers/cuda/sdp_utils.cpp,
    `check_dtypes_low_precision`; `can_use_mem_efficient_attention` takes fp32 on
    sm80 and later, head sizes divisible by 4). Its log-sum-exp is float32 and
    padded to a multiple of 32 tokens, and it keeps its random-number state, a seed
    and an offset (two int64), for the dropout it may replay: torch's own shape
    function says so (`meta__scaled_dot_product_efficient_
    attention` in torch/_meta_registrations.py, torch 2.14.1: `logsumexp_dim =
    math.ceil(M / 32) * 32`, then `seed` and `offset`, 0-d long tensors). ROCm's
    build pads nothing; no test here has measured the CUDA count on a GPU.
    """
    if device_type == "cuda":
        return batch * heads * math.ceil(seq / 32) * 32 * 4 + 2 * 8
    return batch * heads * seq * value_bytes


def korthikanti_bytes(
    batch: int, seq: int, width: int, heads: int, tp: int = 1, sp: bool = False
) -> float:
    """The paper's count for one layer at 16 bits with dropout (its section 4):
    sbh(34 + 5as/h) alone; sbh(10 + 24/t + 5as/(ht)) with tensor parallelism;
    sbh/t (34 + 5as/h) with sequence parallelism too."""
    s, b, h, a, t = seq, batch, width, heads, tp
    scores = 5 * a * s / h
    if sp:
        return s * b * h / t * (34 + scores)
    return s * b * h * (10 + 24 / t + scores / t)


RECOMPUTE = ("none", "selective", "full")


def layer_activation_bytes(
    batch: int,
    seq: int,
    width: int,
    heads: int,
    tp: int = 1,
    *,
    sequence_parallel: bool = False,
    value_bytes: int = 4,
    mask_bytes: int = 0,
    scores_kept: bool = False,
    norm_stats: bool = True,
    recompute: str = "none",
    keep_gathered: bool = True,
    device_type: str = "cpu",
) -> dict[str, int]:
    """One layer's activation bytes by term, for any dtype, dropout and recompute.

    Korthikanti et al.'s count and ours are one formula with four switches, so the
    paper's sbh(34 + 5as/h) is derived here, not quoted. Per token and t = 1:

        norms       2 (h + 2 stats) values; the paper omits the stats
        attn, mlp   (1 + 3 + 1) h and (1 + 4 + 4) h values; a dropout mask of h
                    after each (mask_bytes a value: 1 in a fused CUDA kernel)
        scores      kept: a s values of softmax output, with dropout also its
                    mask and its output; fused (FlashAttention, torch's SDPA):
                    a log-sum-exp per head instead

    The paper's assumptions (value_bytes=2, mask_bytes=1, scores_kept=True,
    norm_stats=False) give 34h + 5as bytes per token; ours (4, 0, False, True)
    give 4 (16h + a + 4), as `block_activation_bytes` and the hooks say. Tensor
    parallelism divides what lies between a column and a row layer by t; sequence
    parallelism the norms, and the column layers' inputs unless keep_gathered (ours
    keep the all-gathered input; Megatron-LM keeps its part and gathers it again).
    Recompute "selective" drops the scores (Korthikanti's attention core), "full"
    keeps only the layer's input (split by t with sequence parallelism).
    `device_type` matters only for fused attention: "cuda" counts what CUDA's
    kernel keeps instead of the CPU's (`fused_attention_lse_bytes`).
    """
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {RECOMPUTE}, got {recompute!r}")
    for name, value in (("heads", heads), ("width", width)):
        if value % tp:
            raise ValueError(f"{name}={value} is not divisible by tensor-parallel {tp}")
    if sequence_parallel and seq % tp:
        raise ValueError(f"seq={seq} is not divisible by tensor-parallel size {tp}")
    h, a, s, v, m = width, heads, seq, value_bytes, mask_bytes
    tokens, split = batch * seq, (tp if sequence_parallel else 1)
    if recompute == "full":
        return {"input": tokens * h * v // split}
    stats = 2 if norm_stats else 0
    norm = tokens * ((h + stats) * v) // split
    if scores_kept:  # bytes of the scores, with dropout their mask and output
        scores = tokens * a // tp * s * (2 * v + m if m else v)
    else:  # fused: a log-sum-exp per head (on CUDA, padded, with an RNG state)
        scores = fused_attention_lse_bytes(batch, a // tp, s, v, device_type)
    col_in = h * v if keep_gathered else h * v // split  # a column layer's input
    return {
        "ln1": norm,
        "attn": tokens * (col_in + 4 * h * v // tp + h * m // split),
        "scores": 0 if recompute == "selective" else scores,
        "ln2": norm,
        "mlp": tokens * (col_in + 8 * h * v // tp + h * m // split),
    }
