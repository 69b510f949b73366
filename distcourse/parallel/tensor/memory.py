"""Activation memory of a transformer block: measured with saved-tensor hooks, and
the formula it must equal, with and without tensor and sequence parallelism, in
each dtype policy.

What autograd keeps between forward and backward is what every op saves for its
backward. `saved_activation_bytes` runs a forward inside
`torch.autograd.graph.saved_tensors_hooks` and adds up the distinct storages the ops
save, leaving out parameters (weights are not activations), by the block's
sub-layer (`ln1`, `attn`, `ln2`, `mlp`).

`block_activation_bytes` is Korthikanti et al. 2022's count (Reducing Activation
Recomputation in Large Transformer Models, section 4), sbh(34 + 5as/h) bytes at 16
bits with dropout, redone for `examples.gpt.Block` as it runs here: dropout 0 (no
masks are saved), layer norms that save their mean and 1/std (two values per
token), and PyTorch's fused attention, which saves its output and one log-sum-exp
per head and token instead of the s x s score matrices (the 5as/h term). Each
tensor is counted in the bytes its dtype policy gives it (`dtypes.Precision`:
r the residual stream's, z a norm statistic's, i a Linear's kept input's, v a
matmul output's, c a kept weight cast's, k = 3 input copies under autocast, else
1). Per token, with h the width, a the heads and t the tensor-parallel size:

    sub-layer  saves                                          bytes per token
    ln1, ln2   input, mean, 1/std                             r h + 2 z each
    attn       q/k/v input (k copies); q, k, v; output        k i h + 4 v h / t
               (= proj input); what the kernel keeps          + kernel
    mlp        fc input; GELU input; proj input               i h + 8 v h / t

and, per micro-batch, the weight casts autocast keeps: c 4 h h / t (attention) and
c 8 h h / t (MLP). The kernel is the one torch picks for the device, the matmul
dtype and the head size (`distcourse.sdpa`): on the CPU a float32 log-sum-exp per
head and token; on CUDA cuDNN's or flash's log-sum-exp and random-number state, the
memory-efficient kernel's log-sum-exp padded to 32 tokens, or the math path's
s x s scores. In fp32 on the CPU (r = z = i = v = 4, c = 0, k = 1) that is
4 (16h + a + 4) bytes per token without tensor parallelism. With sequence
parallelism the norms run on s / t tokens, so their bytes divide by t; the column
layers' inputs stay whole, because ours keep the all-gathered input for backward,
where Megatron-LM keeps its own part and gathers it again (the paper's 34/t divides
everything).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from distcourse.comm.agree import Group, members
from distcourse.parallel.tensor.dtypes import Precision, precision_of, rules_for

CPU_FP32 = Precision("fp32", "cpu")


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
    for `block`'s width and heads, in the precision `x` runs under (its dtype, or
    autocast's; its device's kernels, under torch's attention switches now). No
    messages beyond the twin's own.
    """
    tp = members(group, "block_memory") if twin is not block else None
    t, rank = (tp.size, tp.rank) if tp else (1, 0)
    B, T, C = x.shape
    options = dict(sequence_parallel=sequence_parallel, precision=precision_of(x))
    # first the formula: it refuses sizes that do not split, before any collective
    formula = block_activation_bytes(
        B, T, C, block.attn.n_head, t, live=True, **options
    )
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


def _check_split(
    seq: int, width: int, heads: int, tp: int, sequence_parallel: bool
) -> None:
    """ValueError unless `tp` divides the heads and the width (and, with sequence
    parallelism, the sequence): the split both formulas count."""
    for name, value in (("heads", heads), ("width", width)):
        if value % tp:
            raise ValueError(f"{name}={value} is not divisible by tensor-parallel {tp}")
    if sequence_parallel and seq % tp:
        raise ValueError(f"seq={seq} is not divisible by tensor-parallel size {tp}")


def block_activation_bytes(
    batch: int,
    seq: int,
    width: int,
    heads: int,
    tp: int = 1,
    *,
    sequence_parallel: bool = False,
    precision: Precision = CPU_FP32,
    live: bool = False,
) -> dict[str, int]:
    """What one rank's `examples.gpt.Block` keeps for backward, by sub-layer (bytes).

    The table in this module's docstring, for a (batch, seq, width) input split `tp`
    ways (heads and width must divide by tp; with sequence_parallel, seq too), each
    tensor in the bytes `precision` gives it (default: fp32 on the CPU). `live`:
    the attention kernel under torch's switches now (a run inside `sdpa_kernel`),
    else the one torch picks with every kernel enabled.
    """
    _check_split(seq, width, heads, tp, sequence_parallel)
    h, a, b, s, n = width, heads, batch, seq, batch * seq
    r, z, i, v = (precision.nbytes(k) for k in ("residual", "stats", "input", "value"))
    cast = precision.nbytes("weight_copy")
    norm_tokens = n // tp if sequence_parallel else n
    norm = norm_tokens * (h * r + 2 * z)
    attn = n * (precision.input_copies * i * h + 4 * v * h // tp)
    attn += precision.attention(b, a // tp, s, h // a, live) + cast * 4 * h * h // tp
    mlp = n * (i * h + 8 * v * h // tp) + cast * 8 * h * h // tp
    return {"ln1": norm, "attn": attn, "ln2": norm, "mlp": mlp}


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
    `device_type` matters only for fused attention: "cuda" counts what the kernel
    CUDA picks keeps instead of the CPU's (`dtypes.Precision.attention`: value_bytes
    4 is fp32, 2 bf16).
    """
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {RECOMPUTE}, got {recompute!r}")
    _check_split(seq, width, heads, tp, sequence_parallel)
    h, a, s, v, m = width, heads, seq, value_bytes, mask_bytes
    tokens, split = batch * seq, (tp if sequence_parallel else 1)
    if recompute == "full":
        return {"input": tokens * h * v // split}
    stats = 2 if norm_stats else 0
    norm = tokens * ((h + stats) * v) // split
    if scores_kept:  # bytes of the scores, with dropout their mask and output
        scores = tokens * a // tp * s * (2 * v + m if m else v)
    else:  # fused: a log-sum-exp per head (on CUDA, with an RNG state)
        kind, capability = rules_for(device_type)
        policy = "fp32" if v == 4 else "bf16"
        scores = Precision(policy, kind, capability).attention(
            batch, a // tp, s, h // a
        )
    col_in = h * v if keep_gathered else h * v // split  # a column layer's input
    return {
        "ln1": norm,
        "attn": tokens * (col_in + 4 * h * v // tp + h * m // split),
        "scores": 0 if recompute == "selective" else scores,
        "ln2": norm,
        "mlp": tokens * (col_in + 8 * h * v // tp + h * m // split),
    }
