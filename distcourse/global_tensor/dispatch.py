"""One op on global tensors: check, choose a signature, box, run locally, wrap.

GlobalTensor.__torch_dispatch__ sends every aten op here, in the forward and in the
backward alike (autograd runs above the dispatch). Everything checked here is
metadata that every rank holds alike (placements, signatures, logical shapes), so a
bad call raises the same error on every rank before any collective.

Ops without a rule take the all-broadcast signature, which every deterministic op
has: each input is boxed to B, the op runs on whole tensors, its results are B. The
debug view marks it "(fallback)" and the ledger sees the cost. An in-place or random
op without a rule raises NotImplementedError naming it: on B inputs, a random op
would give each rank different values.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from torch.utils._pytree import tree_flatten, tree_unflatten

from distcourse.global_tensor import debug
from distcourse.global_tensor.boxing import box
from distcourse.global_tensor.placement import Placement
from distcourse.global_tensor.sbp import Broadcast, Signature, Split, describe


@dataclass
class Call:
    """What a rule sees: the op, its arguments, and its tensor operands in order
    (globals and 0-dim plain tensors; `sigs[i]` is None for a plain one)."""

    func: Any
    args: tuple
    kwargs: dict
    tensors: list[Tensor]
    sigs: list[Signature | None]
    placement: Placement
    _out: Any = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return str(func_name(self.func))

    def shape(self, i: int) -> tuple[int, ...]:
        return tuple(self.tensors[i].shape)

    def out_shapes(self) -> list[tuple[int, ...]]:
        """Logical shapes of the outputs, from running the op on meta tensors."""
        if self._out is None:
            meta = _map(self.args, self.kwargs, _to_meta)
            out, _ = tree_flatten(self.func(*meta[0], **meta[1]))
            self._out = [tuple(t.shape) for t in out if isinstance(t, Tensor)]
        return self._out


@dataclass
class Decision:
    """A rule's answer: the signature each operand must have (None: leave a plain
    one alone), each output's signature, and the local computation (None: the op)."""

    needs: list[Signature | None]
    outs: list[Signature]
    local: Callable[..., Any] | None = None


Rule = Callable[[Call], Decision]
RULES: dict[Any, Rule] = {}
_SEEN: dict[Any, tuple[Decision, Any]] = {}  # decisions by op and metadata
MAX_SEEN = 4096


def func_name(func: Any) -> str:
    """ "aten.mm" for aten.mm.default, "aten.add.Tensor" otherwise."""
    name = str(func)
    return name.removesuffix(".default")


def _to_meta(t: Any) -> Any:
    if isinstance(t, Tensor):
        return torch.empty(t.shape, dtype=t.dtype, device="meta")
    return t


def _map(args: tuple, kwargs: dict, fn: Callable[[Any], Any]) -> tuple:
    flat, spec = tree_flatten((args, kwargs))
    return tree_unflatten([fn(a) for a in flat], spec)


def operands(cls: type, flat: list, name: str) -> list[Tensor]:
    """Tensor operands in order; ValueError for mixed placements or plain tensors."""
    tensors = [a for a in flat if isinstance(a, Tensor)]
    globals_ = [t for t in tensors if isinstance(t, cls)]
    first = globals_[0].placement
    for t in globals_[1:]:
        if t.placement != first:
            raise ValueError(
                f"{name}: operands are on different placements, {first} and "
                f"{t.placement}; move one with x.to_global(placement=...)"
            )
    for t in tensors:
        if not isinstance(t, cls) and t.requires_grad and torch.is_grad_enabled():
            raise ValueError(
                f"{name}: mixes a global tensor with a plain tensor that requires "
                "grad: its gradient would be a global tensor, summed over which "
                "ranks? Make it global with gt.to_global(t, placement, sbp)"
            )
        if not isinstance(t, cls) and t.dim() > 0:
            raise ValueError(
                f"{name}: mixes a global tensor with a plain tensor of shape "
                f"{list(t.shape)}; make it global with gt.to_global(t, placement, "
                "sbp) (only 0-d plain tensors, i.e. scalars, mix)"
            )
    return tensors


# ops a rank outside the placement may run on its shape-only tensor
_SHAPE_ONLY = (torch.ops.aten.detach.default, torch.ops.aten.alias.default)


def run(cls: type, func: Any, args: tuple, kwargs: dict) -> Any:
    """The op on global operands: a global result (or a Python value)."""
    name = func_name(func)
    flat, spec = tree_flatten((args, kwargs))
    tensors = operands(cls, flat, name)
    first = next(t for t in tensors if isinstance(t, cls))
    pl = first.placement
    if pl.coord is None and func in _SHAPE_ONLY:  # autograd's detach of a tensor
        return cls(first.local_tensor, pl, first.sbp, tuple(first.shape))  # held
    pl.require_member(name)  # outside the placement (global_tensor.move)
    sigs = [t.sbp if isinstance(t, cls) else None for t in tensors]
    call = Call(func, args, kwargs, tensors, sigs, pl)
    rule = RULES.get(func) or RULES.get(func.overloadpacket)
    inplace = _mutates(func)
    key = _key(cls, func, flat, len(args), tuple(kwargs))
    if key in _SEEN:  # the same op on the same metadata: the same decision
        decision, call._out = _SEEN[key]
    elif rule is None:
        if inplace or torch.Tag.nondeterministic_seeded in func.tags:
            raise NotImplementedError(
                f"{name} has no SBP rule in distcourse.global_tensor (in-place and "
                "random ops need one); box to broadcast and use to_local() instead"
            )
        b = tuple(Broadcast() for _ in range(pl.ndim))
        decision = Decision([b if s else None for s in sigs], [b] * 8)
    else:
        decision = rule(call)
    if debug.active():
        tail = "" if rule else "  (fallback: all broadcast)"
        ins = " x ".join(describe(s) if s else "scalar" for s in sigs)
        outs = ", ".join(describe(s) for s in decision.outs)
        debug.record(f"{name}  {ins} -> {outs}{tail}")
    locals_ = []
    for i, (t, need) in enumerate(zip(tensors, decision.needs, strict=True)):
        if need is None or not isinstance(t, cls):
            locals_.append(t)
            continue
        if need != t.sbp:
            if inplace and i == 0:
                raise NotImplementedError(
                    f"{name}: in place on {describe(t.sbp)} needs {describe(need)}"
                )
            if debug.active():
                debug.record(f"  box arg {i}: {describe(t.sbp)} -> {describe(need)}")
        local = t.local_tensor
        locals_.append(box(local, pl, t.sbp, need, tuple(t.shape)))
    it = iter(locals_)
    flat = [next(it) if isinstance(a, Tensor) else a for a in flat]
    largs, lkwargs = tree_unflatten(flat, spec)
    out = (decision.local or func)(*largs, **lkwargs)
    if inplace:
        result = args[0]
    else:
        result = _wrap(cls, out, decision.outs, call)
    if key is not None and len(_SEEN) < MAX_SEEN:
        _SEEN[key] = (decision, call._out)
    return result


def _key(cls: type, func: Any, flat: list, n: int, names: tuple) -> Any:
    """Everything a rule may look at, hashable: the op, each tensor's shape, dtype,
    signature and placement, every other argument (None if one is unhashable)."""
    parts: list[Any] = [func, n, names]
    for a in flat:
        if isinstance(a, cls):
            parts.append((tuple(a.shape), a.dtype, a.sbp, a.placement))
        elif isinstance(a, Tensor):
            parts.append(("plain", tuple(a.shape), a.dtype))
        else:
            parts.append((type(a), a))
    try:
        hash(tuple(parts))
    except TypeError:
        return None
    return tuple(parts)


def _mutates(func: Any) -> bool:
    """Whether the op writes into its first argument (add_, copy_, ...)."""
    first = func._schema.arguments[0] if func._schema.arguments else None
    info = first.alias_info if first is not None else None
    return bool(info is not None and info.is_write)


def _wrap(cls: type, out: Any, sigs: list[Signature], call: Call) -> Any:
    """Local results as global tensors with the rule's signatures."""
    flat, spec = tree_flatten(out)
    need_meta = any(isinstance(s, Split) for sig in sigs for s in sig)
    shapes = call.out_shapes() if need_meta else None
    wrapped, k = [], 0
    for item in flat:
        if isinstance(item, Tensor):
            shape = shapes[k] if shapes else tuple(item.shape)
            wrapped.append(cls(item, call.placement, sigs[k], shape))
            k += 1
        else:
            wrapped.append(item)
    return tree_unflatten(wrapped, spec)
