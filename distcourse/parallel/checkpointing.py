"""Activation checkpointing: keep less for backward, compute some of it again.

Two policies on a transformer block, as Korthikanti et al. 2022 name them:

- full: `Checkpointed(block)` runs the block under `torch.utils.checkpoint`
  (non-reentrant, torch's recommended form). Only the block's input is kept; the
  whole forward runs again during backward, just before the block's gradients.
- selective: only the attention core (scores, softmax, the product with v) is
  recomputed. `RecomputeAttentionCore` is a torch-function mode that routes every
  `F.scaled_dot_product_attention` through a checkpoint, so the same block, whole or
  split by tensor parallelism, runs unchanged: q, k and v are kept, the core's own
  saved tensors are not. With fused attention (torch's SDPA on CPU, FlashAttention)
  the core keeps only a log-sum-exp per head and token, and its backward already
  recomputes the scores: selective recompute then saves almost nothing, which is
  why FlashAttention is said to "include" it. With the scores kept (the math
  kernel, `torch.nn.attention.sdpa_kernel(SDPBackend.MATH)`), it saves the s x s
  term.

`TorchSelective(block, save)` is the same idea in torch's own API,
`create_selective_checkpoint_contexts`: a policy function says, op by op, which
outputs to keep (`MUST_SAVE`) and which to compute again (`PREFER_RECOMPUTE`); what
it keeps is cached beside autograd, every output of a kept op, needed for backward
or not.

`step_cost` measures what a policy costs: the FLOPs one forward and backward runs
(counted op by op by torch's FlopCounterMode, recompute included) and its time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from distcourse import clock

POLICIES = ("none", "selective", "full")
Device = torch.device | str


class Checkpointed(nn.Module):
    """`block` run under torch.utils.checkpoint: its input kept, its forward redone
    in backward. Same parameters (the same tensors) as `block`."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, x: Tensor) -> Tensor:
        return checkpoint(self.block, x, use_reentrant=False)


class RecomputeAttentionCore(TorchFunctionMode):
    """Inside this mode, scaled_dot_product_attention keeps q, k, v (the
    checkpoint's inputs) and is computed again in backward."""

    def __torch_function__(
        self,
        func: Callable,
        types: tuple,
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            return checkpoint(func, *args, use_reentrant=False, **kwargs)
        return func(*args, **kwargs)


class SelectivelyCheckpointed(nn.Module):
    """`block` whose attention core is recomputed in backward (selective)."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, x: Tensor) -> Tensor:
        with RecomputeAttentionCore():
            return self.block(x)


ATTENTION_OPS = tuple(
    getattr(torch.ops.aten, name).default
    for name in (
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
    )
    if hasattr(torch.ops.aten, name)
)
MATMUL_OPS = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)


class TorchSelective(nn.Module):
    """`block` under torch's selective activation checkpointing: the outputs of
    the ops in `save` are kept, every other op is computed again in backward.
    `preserve_rng_state` as torch's `checkpoint` (False: a dropout mask drawn
    again differs, and so do the gradients)."""

    def __init__(
        self, block: nn.Module, save: tuple, preserve_rng_state: bool = True
    ) -> None:
        super().__init__()
        self.block, self.save, self.preserve = block, save, preserve_rng_state

    def policy(self, _ctx: Any, op: Any, *_args: Any, **_kwargs: Any) -> Any:
        """torch calls this for every op of the forward: keep it or compute again."""
        if op in self.save:
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    def forward(self, x: Tensor) -> Tensor:
        def contexts() -> Any:
            return create_selective_checkpoint_contexts(self.policy)

        return checkpoint(
            self.block,
            x,
            use_reentrant=False,
            context_fn=contexts,
            preserve_rng_state=self.preserve,
        )


def with_policy(block: nn.Module, policy: str) -> nn.Module:
    """`block` as it runs under `policy` ("none", "selective" or "full")."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    wrap = {"none": None, "selective": SelectivelyCheckpointed, "full": Checkpointed}
    return block if wrap[policy] is None else wrap[policy](block)


def checkpoint_blocks(model: nn.Module, policy: str) -> nn.Module:
    """Put every block of `model.blocks` (a TinyGPT, whole or split) under
    `policy`, in place; returns `model`. The parameters stay the same tensors, so
    an optimizer built before or after sees them alike."""
    blocks = model.blocks
    for i, block in enumerate(blocks):
        blocks[i] = with_policy(block, policy)
    return model


# torch.utils.flop_counter is imported where it is used: it imports triton (0.2 s of
# every trainer rank's start-up, which never counts FLOPs)
def _cpu_attention(query, key, value, *_, out_shape=None, **__) -> int:  # noqa: ANN001
    from torch.utils.flop_counter import sdpa_flop_count

    return sdpa_flop_count(query, key, value)


def _cpu_attention_backward(grad, query, key, value, *_, out_shape=None, **__) -> int:  # noqa: ANN001
    from torch.utils.flop_counter import sdpa_backward_flop_count

    return sdpa_backward_flop_count(grad, query, key, value)


# torch's counter knows the CUDA attention kernels, not the CPU one SDPA runs here
CPU_ATTENTION = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_attention,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: (
        _cpu_attention_backward
    ),
}


def step_flops(run: Callable[[], Tensor]) -> int:
    """FLOPs of one forward and backward: `run()` returns a scalar loss, whose
    backward runs here; recomputed forwards are counted where they run. Matrix
    products and attention only (what FlopCounterMode counts), as MFU counts them."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION) as counter:
        run().backward()
    return counter.get_total_flops()


def step_seconds(
    run: Callable[[], Tensor], repeats: int = 5, device: Device = "cpu"
) -> float:
    """The fastest of `repeats` forward-and-backward steps (after one warm-up), each
    timed on `device`, where `run` computes (`clock.timed`: synchronized, or CUDA
    events on a GPU): the minimum is the least disturbed by other work."""
    run().backward()
    best = float("inf")
    for _ in range(repeats):
        best = min(best, clock.timed(lambda: run().backward(), device))
    return best


def step_cost(
    run: Callable[[], Tensor], repeats: int = 5, device: Device = "cpu"
) -> dict[str, float]:
    """{"flops": counted, "seconds": timed on `device`} of one step of `run`."""
    return {"flops": step_flops(run), "seconds": step_seconds(run, repeats, device)}
