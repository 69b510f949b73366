"""SBP rules for reductions, softmax and the losses nn uses.

A sum over a split dim leaves each rank its piece's sum: the total is their sum, P.
A mean over a split dim is the same sum divided by the *logical* count, not each
piece's mean: with uneven pieces (tensor_split's 3 + 2 rows) the mean of local
means is wrong. mse_loss and nll_loss (cross_entropy is log_softmax + nll_loss)
on a split batch follow the same rule; nll_loss divides by the total weight of the
whole batch, which needs one small all_reduce of the pieces' weights.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.ops import aten

from distcourse.comm.autograd import reduce_from_group
from distcourse.global_tensor import debug
from distcourse.global_tensor.dispatch import Call, Decision
from distcourse.global_tensor.rules import B, P, per_dim, pointwise, register
from distcourse.global_tensor.sbp import SBP, Split, numel

MEAN, SUM = 1, 2  # torch's reduction enum: 0 none, 1 mean, 2 sum


def _dims(call: Call) -> list[int]:
    """The reduced dims of a sum / mean, non-negative (all if none are given)."""
    nd = len(call.shape(0))
    dims = call.args[1] if len(call.args) > 1 else call.kwargs.get("dim")
    if dims is None or (isinstance(dims, list | tuple) and not dims):
        return list(range(nd))
    dims = [dims] if isinstance(dims, int) else dims
    return sorted(d % max(nd, 1) for d in dims)


def _keepdim(call: Call) -> bool:
    return bool(call.args[2] if len(call.args) > 2 else call.kwargs.get("keepdim"))


@register(aten.sum.default, aten.sum.dim_IntList, aten.mean.default, aten.mean.dim)
def _reduce(call: Call) -> Decision:
    dims, keep = _dims(call), _keepdim(call)

    def rule(kinds: list[SBP | None], c: Call) -> tuple[list, list]:
        k = kinds[0]
        if isinstance(k, Split):
            if k.dim in dims:
                return [k], [P]
            return [k], [Split(k.dim - (0 if keep else sum(d < k.dim for d in dims)))]
        return [k], [k]

    decision = Decision(*per_dim(call, rule))
    if call.func in (aten.mean.default, aten.mean.dim):
        count = numel([call.shape(0)[d] for d in dims])

        def share_of_mean(
            x: Tensor, *args: Any, dtype: Any = None, **kwargs: Any
        ) -> Tensor:
            return torch.sum(x, dims, keepdim=keep, dtype=dtype) / count

        decision.local = share_of_mean
    return decision


def _batch(kinds: list[SBP | None]) -> bool:
    return any(isinstance(k, Split) for k in kinds)


@register(aten.mse_loss.default)
def _mse(call: Call) -> Decision:
    reduction = call.args[2] if len(call.args) > 2 else call.kwargs.get("reduction", 1)

    def rule(kinds: list[SBP | None], c: Call) -> tuple[list, list]:
        needs, [out] = pointwise(kinds, c, kind=None)
        return needs, [out if reduction == 0 or out == B else P]

    decision = Decision(*per_dim(call, rule))
    if reduction == MEAN:
        count = numel(call.shape(0))

        def share_of_mean_loss(x: Tensor, y: Tensor, *args: Any, **kw: Any) -> Tensor:
            return aten.mse_loss.default(x, y, SUM) / count

        decision.local = share_of_mean_loss
    return decision


@register(aten.mse_loss_backward.default)
def _mse_backward(call: Call) -> Decision:
    reduction = call.args[3]

    def rule(kinds: list[SBP | None], c: Call) -> tuple[list, list]:
        if reduction == 0:
            return pointwise(kinds, c, kind=None)
        sub = Call(c.func, c.args, c.kwargs, c.tensors[1:], c.sigs[1:], c.placement)
        needs, outs = pointwise(kinds[1:], sub, kind=None)
        return [B if kinds[0] is not None else None, *needs], outs

    decision = Decision(*per_dim(call, rule))
    if reduction == MEAN:
        count = numel(call.shape(1))

        def share_of_mean_grad(g: Tensor, x: Tensor, y: Tensor, *args: Any) -> Tensor:
            return aten.mse_loss_backward.default(g, x, y, SUM) / count

        decision.local = share_of_mean_grad
    return decision


def _nll_rule(kinds: list[SBP | None], call: Call, out: bool) -> tuple[list, list]:
    """nll_loss on one mesh dim: a split batch (input S(0), target S(0)), else all B.

    `kinds` are (input, target, weight...) for the forward, with the gradient first
    for the backward (out=False).
    """
    head = [] if out else [B]
    body = kinds if out else kinds[1:]
    if len(call.shape(len(head))) == 2 and _batch(body[:2]):
        needs = [Split(0), Split(0)] + [B if k else None for k in body[2:]]
        outs = [P if call.args[3 + len(head)] else Split(0), B] if out else [Split(0)]
        return head + needs, outs
    needs = [B if k else None for k in body]
    return head + needs, ([B, B] if out else [B])


@register(aten.nll_loss_forward.default)
def _nll(call: Call) -> Decision:
    decision = Decision(*per_dim(call, lambda k, c: _nll_rule(k, c, True)))
    reduction = call.args[3]
    split = [k for k, s in enumerate(decision.outs[0]) if s == P]
    if reduction == 0 or not split:
        return decision
    pl = call.placement

    def piece_loss_and_weight(
        x: Tensor, t: Tensor, w: Tensor | None, r: int, ignore: int
    ) -> Any:
        total, _ = aten.nll_loss_forward.default(x, t, w, SUM, ignore)
        keep = (t != ignore).to(x.dtype)
        weight = keep if w is None else w[t.clamp(0, x.size(-1) - 1)] * keep
        count = weight.sum()
        for k in split:  # the whole batch's weight: one small all_reduce per dim
            if debug.active():
                debug.record(f"    mesh dim {k}: total weight  all_reduce")
            count = reduce_from_group(count, pl.groups[k], check=False)
        return (total / count if r == MEAN else total), count

    decision.local = piece_loss_and_weight
    return decision


@register(aten.nll_loss_backward.default)
def _nll_backward(call: Call) -> Decision:
    return Decision(*per_dim(call, lambda k, c: _nll_rule(k, c, False)))


@register(aten._log_softmax.default, aten._softmax.default)
def _softmax(call: Call) -> Decision:
    dim = call.args[1] % len(call.shape(0))

    def rule(kinds: list[SBP | None], c: Call) -> tuple[list, list]:
        k = kinds[0]
        keep = isinstance(k, Split) and k.dim != dim or k == B
        return [k if keep else B], [k if keep else B]

    return Decision(*per_dim(call, rule))


@register(aten._log_softmax_backward_data.default, aten._softmax_backward_data.default)
def _softmax_backward(call: Call) -> Decision:
    dim = call.args[2] % len(call.shape(0))

    def rule(kinds: list[SBP | None], c: Call) -> tuple[list, list]:
        k = kinds[1]  # the forward's output
        keep = k if isinstance(k, Split) and k.dim != dim else B
        return [keep, keep], [keep]

    return Decision(*per_dim(call, rule))
