"""SBP rules for elementwise ops, matmul and views, one mesh dimension at a time.

A rule looks at its operands' SBP on one mesh dimension and answers the SBP each
operand must have there and the output's; `per_dim` runs it on every mesh dimension,
which is how a 2-D rule is derived (OneFlow does the same). Where the operands do
not fit a signature the rule picks the nearest one and dispatch boxes them.

matmul (mm, addmm; nn.Linear decomposes into them), as OneFlow lists:
    S(0) x B -> S(0)   B x S(1) -> S(1)   S(1) x S(0) -> P
    P x B -> P         B x P -> P         B x B -> B
elementwise, shapes broadcast from the right:
    S(i) op S(i) -> S(i)   S op B -> S (a broadcast dim takes B)
    P + P -> P, P - P -> P (a B operand boxes to P: coordinate 0 keeps it)
    P * B -> P, P / B -> P, -P -> P, relu'(x) * P -> P (linear in one operand)
    relu, gelu, exp, ... take no P: relu(a) + relu(b) != relu(a + b)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.ops import aten

from distcourse.global_tensor.dispatch import RULES, Call, Decision
from distcourse.global_tensor.sbp import SBP, Broadcast, PartialSum, Split, local_shape

B, P = Broadcast(), PartialSum()
OneDim = Callable[[list[SBP | None], Call], tuple[list[SBP | None], list[SBP]]]


def per_dim(call: Call, rule: OneDim) -> tuple[list, list]:
    """Run a one-mesh-dimension rule on every mesh dimension; assemble signatures."""
    needs: list[list] = [[] for _ in call.sigs]
    outs: list[list] = []
    for k in range(call.placement.ndim):
        need, out = rule([s[k] if s else None for s in call.sigs], call)
        for i, n in enumerate(need):
            needs[i].append(n)
        outs = outs or [[] for _ in out]
        for i, o in enumerate(out):
            outs[i].append(o)
    fixed = [tuple(n) if s else None for n, s in zip(needs, call.sigs, strict=True)]
    return fixed, [tuple(o) for o in outs]


def register(*ops: Any) -> Callable:
    def deco(fn: Callable[[Call], Decision]) -> Callable[[Call], Decision]:
        for op in ops:
            RULES[op] = fn
        return fn

    return deco


# -------------------------------------------------------------- elementwise ----

ADD = [
    aten.add.Tensor,
    aten.sub.Tensor,
    aten.add_.Tensor,
    aten.sub_.Tensor,
    aten.lerp.Scalar,
    aten.lerp_.Scalar,
    aten.copy_.default,
]
MUL = [aten.mul.Tensor, aten.mul_.Tensor]
FIRST = [
    aten.div.Tensor,
    aten.div_.Tensor,
    aten.threshold_backward.default,
    aten.gelu_backward.default,
    aten.sigmoid_backward.default,
    aten.tanh_backward.default,
    aten.silu_backward.default,
]
UNARY = [
    aten.neg.default,
    aten.mul.Scalar,
    aten.div.Scalar,
    aten.mul_.Scalar,
    aten.div_.Scalar,
    aten.clone.default,
    aten.detach.default,
    aten.alias.default,
    aten._to_copy.default,
    aten.zero_.default,
]
NONLINEAR = [
    aten.relu.default,
    aten.relu_.default,
    aten.gelu.default,
    aten.sigmoid.default,
    aten.tanh.default,
    aten.exp.default,
    aten.log.default,
    aten.sqrt.default,
    aten.rsqrt.default,
    aten.abs.default,
    aten.pow.Tensor_Scalar,
    aten.silu.default,
    aten.add.Scalar,
    aten.sub.Scalar,
    aten.rsub.Scalar,
    aten.addcmul.default,
    aten.addcmul_.default,
    aten.addcdiv.default,
    aten.addcdiv_.default,
    aten.maximum.default,
    aten.minimum.default,
    aten.clamp.default,
    aten.fill_.Scalar,
    aten.where.self,
    aten.eq.Tensor,
    aten.eq.Scalar,
    aten.gt.Scalar,
    aten.lt.Scalar,
    aten.ge.Scalar,
    aten.le.Scalar,
    aten.sign.default,
    aten.reciprocal.default,
    aten.sqrt_.default,
    aten.square.default,
]
KIND = {
    **{op: "add" for op in ADD},
    **{op: "mul" for op in MUL},
    **{op: "first" for op in FIRST},
    **{op: "unary" for op in UNARY},
    **{op: None for op in NONLINEAR},
}


def out_shape(shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    """The broadcast shape of operands aligned from the right."""
    nd = max(len(s) for s in shapes)
    out = [1] * nd
    for s in shapes:
        for i, n in enumerate(s):
            j = i + nd - len(s)
            out[j] = n if out[j] == 1 else out[j]
    return tuple(out)


def need_for(target: SBP, shape: tuple[int, ...], out: tuple[int, ...]) -> SBP:
    """What an operand of `shape` needs for an output of `out` under `target`."""
    if not isinstance(target, Split):
        return target
    j = target.dim - (len(out) - len(shape))
    return Split(j) if j >= 0 and shape[j] == out[target.dim] else B


def pointwise(
    kinds: list[SBP | None], call: Call, kind: str | None = None, inplace: bool = False
) -> tuple[list, list]:
    """The elementwise rule on one mesh dimension (see the module docstring)."""
    kind = KIND.get(call.func, kind) if kind is None else kind
    shapes = [call.shape(i) for i in range(len(kinds))]
    out = shapes[0] if inplace else out_shape(shapes)
    plain = (
        any(k is None for k in kinds)
        or any(  # a plain scalar operand
            isinstance(a, int | float) for a in call.args[:2]
        )
    )
    target: SBP = B
    for k, shape in zip(kinds, shapes, strict=True):
        if inplace and k is not None:  # the output is the first operand
            target = Split(k.dim + len(out) - len(shape)) if isinstance(k, Split) else k
            break
        if (
            isinstance(k, Split)
            and need_for(Split(k.dim + len(out) - len(shape)), shape, out) == k
        ):
            target = Split(k.dim + len(out) - len(shape))
            break
    else:
        if any(k == P for k in kinds) and kind is not None:
            target = P if kind != "first" or kinds[0] == P else B
        if target == P and kind == "add" and plain:
            target = B  # x + 2 on P would add 2 once per rank
    if target == P and inplace and (kind is None or (kind == "add" and plain)):
        raise NotImplementedError(f"{call.name} in place on a partial sum")
    needs: list[SBP | None] = []
    kept = False  # P x B: the first P operand stays P, the rest become B
    for k, shape in zip(kinds, shapes, strict=True):
        if k is None:
            needs.append(None)
        elif target == P and kind != "add":
            first = k == P and not kept and (kind != "first" or not needs)
            kept = kept or first
            needs.append(P if first else B)
        else:
            needs.append(need_for(target, shape, out))
    return needs, [target]


def _elementwise(call: Call) -> Decision:
    inplace = call.func._schema.name.endswith("_")
    needs, outs = per_dim(call, lambda k, c: pointwise(k, c, None, inplace))
    return Decision(needs, outs)


for _op in KIND:
    RULES[_op] = _elementwise


# ------------------------------------------------------------------ matmul ----


def matmul(kinds: list[SBP | None], call: Call) -> tuple[list, list]:
    """mm on one mesh dimension: the operands' SBPs fixed up to a valid signature."""
    a, b = kinds[-2], kinds[-1]
    if a == Split(0):
        need, out = [Split(0), B], Split(0)
    elif a == Split(1):
        need, out = [Split(1), Split(0)], P
    elif a == P:
        need, out = [P, B], P
    elif b == Split(1):
        need, out = [B, Split(1)], Split(1)
    elif b == Split(0):
        need, out = [Split(1), Split(0)], P
    elif b == P:
        need, out = [B, P], P
    else:
        need, out = [B, B], B
    if len(kinds) == 3:  # addmm: the bias is added to the product
        product = (call.shape(1)[0], call.shape(2)[1])
        need = [out if out == P else need_for(out, call.shape(0), product), *need]
    return need, [out]


@register(aten.mm.default, aten.addmm.default)
def _mm(call: Call) -> Decision:
    if any(len(call.shape(i)) != 2 for i in range(len(call.tensors))[-2:]):
        raise NotImplementedError(f"{call.name} on operands that are not 2-D")
    return Decision(*per_dim(call, matmul))


# ------------------------------------------------------------------- views ----


def _moved(call: Call, where: Callable[[int], int | None]) -> Decision:
    """A view that moves tensor dims: S(i) -> S(where(i)), or B where it is None."""

    def rule(kinds: list[SBP | None], c: Call) -> tuple[list, list]:
        k = kinds[0]
        if isinstance(k, Split):
            j = where(k.dim)
            return [k if j is not None else B], [Split(j) if j is not None else B]
        return [k], [k]

    return Decision(*per_dim(call, rule))


@register(aten.t.default, aten.transpose.int, aten.permute.default)
def _transpose(call: Call) -> Decision:
    nd = len(call.shape(0))
    if call.func == aten.permute.default:
        order = [d % nd for d in call.args[1]]
    else:
        a, b = (0, 1) if call.func == aten.t.default else call.args[1:3]
        order = list(range(nd))
        if nd >= 2:
            order[a % nd], order[b % nd] = order[b % nd], order[a % nd]
    return _moved(call, lambda i: order.index(i))


@register(aten.unsqueeze.default)
def _unsqueeze(call: Call) -> Decision:
    dim = call.args[1] % (len(call.shape(0)) + 1)
    return _moved(call, lambda i: i + (i >= dim))


def _resized(call: Call, where: Callable[[int], int | None]) -> Decision:
    """view / expand: the new size is the logical one; each rank asks its piece's."""
    decision = _moved(call, where)
    shape = call.out_shapes()[0]
    pl = call.placement

    def resize_piece(x: Any, _size: Any, *rest: Any, **kw: Any) -> Any:
        size = local_shape(shape, decision.outs[0], pl.hierarchy, pl.coord)
        return call.func(x, list(size), *rest, **kw)

    decision.local = resize_piece
    return decision


@register(aten.view.default, aten._unsafe_view.default)
def _view(call: Call) -> Decision:
    old, new = call.shape(0), call.out_shapes()[0]
    sig, mesh = call.sigs[0], call.placement.hierarchy

    def where(i: int) -> int | None:
        """Where split dim i goes: the same size at the same offset, or (when every
        piece stays whole rows) the head of a merge or of a split of dims."""
        ways = _prod([n for s, n in zip(sig, mesh, strict=True) if s == Split(i)])
        j = next(
            (j for j in range(len(new) + 1) if _prod(new[:j]) >= _prod(old[:i])),
            len(new),
        )
        if j == len(new) or _prod(new[:j]) != _prod(old[:i]):
            return None
        if new[j] == old[i]:
            return j
        even = old[i] % ways == 0 and new[j] % ways == 0
        merged = new[j] == _prod(old[i : i + _run(old[i:], new[j])])
        split = old[i] == _prod(new[j : j + _run(new[j:], old[i])])
        return j if even and (merged or split) else None

    return _resized(call, where)


@register(aten.expand.default)
def _expand(call: Call) -> Decision:
    old, new = call.shape(0), call.out_shapes()[0]
    off = len(new) - len(old)
    return _resized(call, lambda i: i + off if old[i] == new[i + off] else None)


def _run(sizes: tuple[int, ...], total: int) -> int:
    """How many leading sizes multiply to `total` (0 if none do)."""
    acc = 1
    for m, n in enumerate(sizes, 1):
        acc *= n
        if acc == total:
            return m
    return 0


def _prod(xs: tuple[int, ...] | list[int]) -> int:
    out = 1
    for x in xs:
        out *= x
    return out


# ----------------------------------------------------------- like / new_* ----


@register(
    aten.zeros_like.default,
    aten.ones_like.default,
    aten.empty_like.default,
    aten.full_like.default,
)
def _like(call: Call) -> Decision:
    """A new tensor shaped like x: S stays S; P becomes B (ones under P would sum)."""
    sig = tuple(B if s == P else s for s in call.sigs[0])
    return Decision([call.sigs[0]] + [None] * (len(call.tensors) - 1), [sig])


@register(
    aten.new_zeros.default,
    aten.new_ones.default,
    aten.new_empty.default,
    aten.new_full.default,
)
def _new(call: Call) -> Decision:
    """x.new_zeros(size): a whole tensor of the given (logical) size on every rank."""
    b = tuple(B for _ in range(call.placement.ndim))
    return Decision([call.sigs[0]], [b])
