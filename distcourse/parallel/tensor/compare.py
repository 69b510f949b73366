"""Is a split module the one-process module? Outputs and every gradient, compared.

`differences(module, twin, x)` runs the one-process `module` on the whole x and its
tensor-parallel `twin` on this rank's share (all of x, or with sequence_parallel
its part of the sequence), backpropagates the same loss (sum of squares) through
both, and returns the largest absolute difference of the output, of x's gradient
and of each parameter's gradient, this rank's slice of the whole one's, each
divided by max(1, largest |entry| of the one-process tensor): relative for large
values, absolute near 0 (a key's bias has a gradient of exactly 0). A missing
f or g shows up here as a gradient or an output that is off by far more than
rounding: the check can fail.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from distcourse.comm.agree import Group, members


def shard_of(full: Tensor, mine: Tensor, group: Group = None) -> Tensor:
    """The slice of `full` that a parameter shaped like `mine` holds on this rank:
    equal chunks along the one dim where the shapes differ (all of it if none)."""
    tp = members(group, "shard_of")
    dims = [dim for dim in range(full.dim()) if full.shape[dim] != mine.shape[dim]]
    if full.dim() != mine.dim() or len(dims) > 1:
        raise ValueError(
            f"no slice of a {list(full.shape)} tensor is shaped {list(mine.shape)}"
        )
    return full.chunk(tp.size, dims[0])[tp.rank] if dims else full


def differences(
    module: nn.Module,
    twin: nn.Module,
    x: Tensor,
    *,
    sequence_parallel: bool = False,
    seq_dim: int = 1,
    group: Group = None,
) -> dict[str, float]:
    """Max |twin - module| / max(1, max |module|) of the output, x's gradient and
    every parameter gradient.

    Every rank passes the same x (and the same `module`); `twin`'s parameters must
    have `module`'s names. Gradients are compared after one backward of
    sum(output ** 2); existing gradients are cleared first.
    """
    tp = members(group, "differences")
    module.zero_grad(set_to_none=True)
    twin.zero_grad(set_to_none=True)
    whole = x.detach().clone().requires_grad_()
    y = module(whole)
    y.square().sum().backward()
    mine = whole.detach()
    if sequence_parallel:
        mine = mine.tensor_split(tp.size, seq_dim)[tp.rank]
    mine = mine.clone().requires_grad_()
    y2 = twin(mine)
    y2.square().sum().backward()

    def part(t: Tensor) -> Tensor:
        return t.tensor_split(tp.size, seq_dim)[tp.rank] if sequence_parallel else t

    found = {
        "output": _max_diff(y2, part(y)),
        "input grad": _max_diff(mine.grad, part(whole.grad)),
    }
    full = dict(module.named_parameters())
    for name, param in twin.named_parameters():
        grad = torch.zeros_like(param) if param.grad is None else param.grad
        ref = full[name].grad
        ref = torch.zeros_like(full[name]) if ref is None else ref
        found[f"{name} grad"] = _max_diff(grad, shard_of(ref, grad, group))
    return found


def _max_diff(a: Tensor, b: Tensor) -> float:
    """max |a - b| / max(1, max |b|): b is the one-process reference."""
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {list(a.shape)} and {list(b.shape)}")
    if not a.numel():
        return 0.0
    return ((a - b).abs().max() / b.abs().max().clamp(min=1.0)).item()


def gradient_differences(
    twin: nn.Module, other: nn.Module, group: Group = None
) -> dict[str, float]:
    """Max |twin's grad - other's| / max(1, max |other's|) for every parameter of
    `twin`, where `other` is the same model split another way: e.g. by torch's
    parallelize_module, whose gradients are DTensors (made whole, then this rank's
    slice taken as `shard_of` does). A collective when `other` holds DTensors:
    every rank calls it, with the same models."""
    theirs = dict(other.named_parameters())
    found = {}
    for name, param in twin.named_parameters():
        grad, ref = param.grad, theirs[name].grad
        if grad is None or ref is None:
            raise ValueError(f"{name!r} has no gradient in one of the models")
        if hasattr(ref, "full_tensor"):  # a DTensor: Shard, Replicate or Partial
            ref = ref.full_tensor()
        found[f"{name} grad"] = _max_diff(grad, shard_of(ref, grad, group))
    return found
