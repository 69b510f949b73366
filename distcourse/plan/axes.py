"""Chapter 12's two axes in the planner: experts (MoE, split over ep ranks) and
context parallelism (each sequence split over cp ranks, ring attention).

The GPUs are dp x tp x pp x ep x cp, the product of `hybrid.layout.Layout.world`
(ep is an axis of its own, not carved out of dp): the grid (dp, pp, ep, cp, tp),
tp innermost. The batch splits into dp x ep shares (expert-parallel ranks hold
different tokens, as `Layout` checks); a sequence into cp parts of s / cp tokens.

Notation as in `plan.memory`, and E experts per MoE layer (every block's MLP is
one when E > 0), k of them per token, f the capacity factor; n = b s // c the
tokens of a micro-batch on a rank (c = cp), u a matmul output's bytes and i a
Linear's kept input's (the policy's, `parallel.tensor.dtypes`), X = n (h // t) u
the bytes of its K (as of its V) in one attention layer.

Parameters. With E > 0 a block's MLP, M = (4 h h + 4h) // t + 4 h h // t + h
elements in 4 tensors (`plan.memory.block_params`; for t = 1 it is
`experts.cost.expert_parameters(h)`), becomes E // ep experts of M each (4 tensors
each) and a router of h E (one tensor, replicated). Two groups of parameters
share gradients and ZeRO shards: the dense ones over dp x ep x cp ranks (every
rank that holds them), the experts' over dp x cp; with ep = cp = 1 both are dp.

Activations of a block (ckpt none or selective) with E > 0: the MLP's
n (i h + 8 u h // t) becomes n i h (the router's input) + n E u (its
probabilities) + k n (i h + 8 u h // t) (each assignment's row, fc and GELU
outputs). With cp, every activation is that of seq s / c (`plan.memory`).

Buffers, alive one layer at a time: the experts' dispatch rows,
`experts.cost.memory_per_rank(n, h, E, k, f, ep, u)["buffers"]`; ring
attention's K/V messages, 8X in the backward (`context.cost`'s docstring: the
pair in use and the pair arriving, with dK and dV).

FLOPs a token in a block's forward with E > 0: 8 h h (attention) + k 16 h h (its
experts) + 2 h E (the router) + 4 s h, instead of 24 h h + 4 s h.

Wire bytes per micro-batch and attention (MoE) layer:

    cp  `context.cost.ring_bytes(X, c)`: cp - 1 passes of K and V forward, of
        K, V, dK, dV backward, one of dK, dV home, handshakes, the agreement;
        alpha steps (2c - 1) + (c - 1)
    ep  `experts.cost.balanced_bytes(n, h, E, k, ep, u)`: the counts, and two
        all_to_alls of k n rows forward and two backward, (ep - 1) / ep of them
        away; alpha steps 5 (ep - 1)
"""

from __future__ import annotations

from distcourse.parallel.context.cost import ring_bytes
from distcourse.parallel.experts.cost import balanced_bytes, memory_per_rank
from distcourse.parallel.tensor.dtypes import Precision
from distcourse.plan.spec import ModelSpec, PlanLayout


def mlp_params(h: int, t: int) -> int:
    """One MLP's (one expert's) elements on a rank of tp = t."""
    return (4 * h * h + 4 * h) // t + 4 * h * h // t + h


def param_groups(
    model: ModelSpec, layout: PlanLayout, dense: int, tensors: int, blocks: int
) -> dict[int, tuple[int, int]]:
    """{group size: (elements, tensors)} of a rank holding `blocks` blocks of
    `dense` elements and `tensors` tensors as if dense; one entry when both
    groups have the same size (as with ep = cp = 1)."""
    d = layout.dp * layout.cp
    if not model.experts:
        return {d * layout.ep: (dense, tensors)}
    E, h, local = model.experts, model.hidden, model.experts // layout.ep
    experts = blocks * local * mlp_params(h, layout.tp)
    dense += blocks * (h * E - mlp_params(h, layout.tp))
    groups = {d * layout.ep: (dense, tensors - 3 * blocks)}
    n, t = groups.get(d, (0, 0))
    groups[d] = (n + experts, t + 4 * blocks * local)
    return groups


def block_delta(model: ModelSpec, layout: PlanLayout) -> int:
    """What E > 0 adds to one block's elements on a rank: E // ep experts and the
    router for the MLP (ZeRO-3 gathers a whole block)."""
    if not model.experts:
        return 0
    mlp = mlp_params(model.hidden, layout.tp)
    return (model.experts // layout.ep - 1) * mlp + model.hidden * model.experts


def moe_activation_delta(model: ModelSpec, n: int, t: int, prec: Precision) -> int:
    """What E > 0 adds to a block's activations (module docstring), n tokens."""
    if not model.experts:
        return 0
    h, k = model.hidden, model.top_k
    i, u = prec.nbytes("input"), prec.nbytes("value")
    dense = n * (i * h + 8 * u * h // t)
    return n * i * h + n * model.experts * u + k * dense - dense


def moe_flops_delta(model: ModelSpec, n: int) -> int:
    """What E > 0 adds to a block's forward FLOPs for n tokens."""
    if not model.experts:
        return 0
    h = model.hidden
    return n * ((model.top_k - 1) * 16 * h * h + 2 * h * model.experts)


def axis_buffers(model: ModelSpec, layout: PlanLayout, n: int, prec: Precision) -> int:
    """Dispatch rows (E > 0) and ring K/V messages (cp > 1), one layer's."""
    out, e = 0, prec.nbytes("value")
    if model.experts:
        out += memory_per_rank(
            n,
            model.hidden,
            model.experts,
            model.top_k,
            model.capacity_factor,
            layout.ep,
            e,
        )["buffers"]
    if layout.cp > 1:
        out += 8 * n * (model.hidden // layout.tp) * e
    return out


def layer_messages(
    model: ModelSpec, layout: PlanLayout, n: int, prec: Precision
) -> dict[str, tuple[int, int]]:
    """(wire bytes, alpha steps) of one attention/MoE layer's step, cp and ep."""
    c, ep, e = layout.cp, layout.ep, prec.nbytes("value")
    out = {}
    if c > 1:
        kv = n * (model.hidden // layout.tp) * e
        out["cp"] = (ring_bytes(kv, c), 3 * c - 2)
    if ep > 1:
        h, E, k = model.hidden, model.experts, model.top_k
        out["ep"] = (balanced_bytes(n, h, E, k, ep, e), 5 * (ep - 1))
    return out
