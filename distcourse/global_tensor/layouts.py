"""Layouts: a plain model's parameters made global, one signature per tensor.

A layout is a plan: a dict from a parameter's name to its SBP signature. On a 2 x 2
placement with mesh dimension 0 for data parallelism and mesh dimension 1 for
tensor parallelism, the DP x TP layout in nn.Linear's (out, in) layout is

    data                          (S(0), B)  rows split across the mesh rows
    column-parallel weight, bias  (B, S(0))  output features split along a row
    row-parallel weight           (B, S(1))  input features split along a row
    row-parallel bias, the rest   (B, B)     whole on every rank

The rules of chapter 6 then give Megatron's MLP with no code of its own: data
(S(0), B) times a column weight gives (S(0), S(1)); times a row weight, (S(0), P);
its P is the row layer's all_reduce, and each broadcast parameter's gradient,
boxed P -> B on arrival, is data parallelism's all_reduce over the mesh columns.

`parallelize(model, placement, plan)` applies a plan; every check runs on metadata
that every rank holds (names, shapes, the placement), so bad input raises the same
ValueError on every rank before any message.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor, nn

from distcourse.comm.ledger import ring_wire_bytes
from distcourse.global_tensor.create import to_global, watch_grad
from distcourse.global_tensor.placement import Placement
from distcourse.global_tensor.sbp import (
    Broadcast,
    PartialSum,
    Signature,
    Split,
    describe,
    local_piece,
    signature,
    split,
)
from distcourse.global_tensor.tensor import GlobalTensor

B = Broadcast()
DATA: Signature = (split(0), B)  # batch rows across mesh dim 0 (data parallel)
COLUMN: Signature = (B, split(0))  # (out, in) weight: output features on mesh dim 1
ROW: Signature = (B, split(1))  # (out, in) weight: input features on mesh dim 1
REPLICATED: Signature = (B, B)


def dp_tp_plan(
    model: nn.Module, column: Iterable[str] = (), row: Iterable[str] = ()
) -> dict[str, Signature]:
    """The DP x TP plan of `model`: the nn.Linear submodules named in `column`
    get COLUMN weights and biases, those in `row` ROW weights and REPLICATED biases,
    every other parameter REPLICATED."""
    subs = dict(model.named_modules())
    plan = {name: REPLICATED for name, _ in model.named_parameters()}
    for names, weight, bias in ((column, COLUMN, COLUMN), (row, ROW, REPLICATED)):
        for name in names:
            if not isinstance(subs.get(name), nn.Linear):
                got = type(subs[name]).__name__ if name in subs else "nothing"
                raise ValueError(
                    f"dp_tp_plan: {name!r} must name an nn.Linear of "
                    f"the model, it names {got}"
                )
            plan[f"{name}.weight"] = weight
            if subs[name].bias is not None:
                plan[f"{name}.bias"] = bias
    return plan


def fits(name: str, shape: tuple[int, ...], sig: Any, pl: Placement) -> Signature:
    """`sig` checked for a tensor `name` of `shape` on `pl`: one SBP per mesh
    dimension, no partial sum, and every split into equal pieces (as the
    tensor-parallel layers and DTensor's chunks need). ValueError names the tensor."""
    sig = signature(sig, pl.ndim, len(shape), name)
    if any(isinstance(s, PartialSum) for s in sig):
        raise ValueError(
            f"{name}: a parameter cannot be a partial sum "
            f"({describe(sig)}): its value would be a sum of "
            "pieces that no rank holds"
        )
    for dim in {s.dim for s in sig if isinstance(s, Split)}:
        ways = math.prod(
            n for s, n in zip(sig, pl.hierarchy, strict=True) if s == Split(dim)
        )
        if shape[dim] % ways:
            raise ValueError(
                f"{name}: {describe(sig)} splits dim {dim} of shape {list(shape)} "
                f"{ways} ways, but {shape[dim]} is not divisible by {ways}"
            )
    return sig


def check_plan(
    model: nn.Module, placement: Any, plan: dict[str, Any], rest: Any = None
) -> dict[str, Signature]:
    """The plan checked against the model's parameters (no messages): every name a
    parameter, every signature fitting, every parameter named once (or, with
    `rest`, those not named take `rest`)."""
    if not isinstance(placement, Placement):
        raise TypeError(
            f"placement must be a Placement (gt.placement(...)), got "
            f"{type(placement).__name__}"
        )
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    unknown = sorted(set(plan) - set(shapes))
    if unknown:
        raise ValueError(
            f"plan names {unknown}, which are not parameters of the "
            f"model (it has {sorted(shapes)})"
        )
    missing = sorted(set(shapes) - set(plan))
    if rest is not None:  # one SBP stands for itself on every mesh dimension
        whole = rest if isinstance(rest, tuple) else (rest,) * placement.ndim
        plan = {**dict.fromkeys(missing, whole), **plan}
    elif missing:
        raise ValueError(
            f"plan gives no signature for {missing}: name every "
            "parameter (REPLICATED for a whole one)"
        )
    return {n: fits(n, shapes[n], plan[n], placement) for n in shapes}


def parallelize(
    model: nn.Module,
    placement: Placement,
    plan: dict[str, Any],
    *,
    rest: Any = None,
) -> nn.Module:
    """Every parameter of `model` made a global parameter on `placement` under its
    plan's signature (changed in place, returned); with `rest` (e.g. broadcast,
    meaning B on every mesh dimension), the parameters the plan does not name
    take it. The values are coordinate 0's
    (one broadcast per mesh dimension, as gt.to_global); a gradient arrives in the
    parameter's signature (a P boxed to B: the all_reduce of data parallelism)."""
    sigs = check_plan(model, placement, plan, rest)
    placement.require_member("parallelize")
    whole = tuple(B for _ in range(placement.ndim))
    for name, p in list(model.named_parameters()):
        owner, _, leaf = name.rpartition(".")
        sub = model.get_submodule(owner)
        with torch.no_grad():
            value = to_global(p.detach(), placement, whole).to_global(sbp=sigs[name])
        new = nn.Parameter(value, requires_grad=p.requires_grad)
        if p.requires_grad:
            watch_grad(new)
        sub.register_parameter(leaf, new)
    return model


def signatures(model: nn.Module) -> dict[str, tuple[str, str]]:
    """Each parameter's signature and its gradient's, as text ("-" for none)."""
    out = {}
    for name, p in model.named_parameters():
        grad = describe(p.grad.sbp) if isinstance(p.grad, GlobalTensor) else "-"
        sig = describe(p.sbp) if isinstance(p, GlobalTensor) else "-"
        out[name] = (sig, grad)
    return out


def cut(whole: Tensor, placement: Placement, sbp: Any) -> GlobalTensor:
    """A tensor that every rank holds whole (seeded data, as gt.randn draws it) as
    a global tensor: each rank of `placement` keeps its piece, no messages."""
    sig = signature(sbp, placement.ndim, whole.dim(), "cut")
    coord = placement.require_member("cut")
    piece = local_piece(whole, sig, placement.hierarchy, coord)
    return GlobalTensor(piece.to(placement.device), placement, sig, tuple(whole.shape))


def mlp_step_bytes(
    rows: int,
    c: int,
    hidden: int,
    dp: int,
    tp: int,
    *,
    boxed: bool = True,
    item: int = 4,
) -> int:
    """Bytes one rank puts on the wire (as the Ledger counts) in a forward and
    backward of an MLP Linear(c, hidden) -> GELU -> Linear(hidden, c) under
    dp_tp_plan on a dp x tp placement (dp, tp >= 2), input `rows` x c under DATA,
    no input gradient.

    The row layer's output is (S(0), P): one all_reduce of this rank's rows on mesh
    dim 1 when it is boxed to DATA (`boxed`); unboxed, the loss boxes it in forward
    and its backward boxes the saved P output again: two. Then each parameter's
    gradient arrives P on mesh dim 0 and is all_reduced there: proj's bias (c) and
    weight columns (c x hidden / tp), fc's weight rows and bias (hidden / tp each).
    An all_reduce of T bytes on n ranks puts 2(n-1)T/n on the wire (the ring).
    """
    act = ring_wire_bytes("all_reduce", rows // dp * c * item, tp)
    grads = [c, c * hidden // tp, c * hidden // tp, hidden // tp]
    sent = sum(ring_wire_bytes("all_reduce", g * item, dp) for g in grads)
    return act * (1 if boxed else 2) + sent
