"""Zero bubble (ZB-H1): the backward split in two, and a schedule that uses the split.

A stage's backward does two jobs: the gradient of its input, which the previous stage
waits for, and the gradients of its own weights, which nobody waits for until the
optimizer step. ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", 2023) runs them
as separate actions: B (input gradient, sent at once) and W (weight gradients, later),
and uses the W's to fill the idle slots of 1F1B's drain. With equal F, B and W times
each rank idles (p - 1) units instead of 1F1B's 3 (p - 1), at 1F1B's memory.

The split, on autograd's graph: B asks autograd for the input's gradient only,
keeping the graph (retain_graph), while a pre-hook catches the gradient arriving at
each node where the input's path meets a branch that leads to parameters; W restarts
autograd from those nodes with the caught gradients, towards the parameters alone, so
no node's work runs twice. torch.distributed.pipelining does the same
(stage_backward_input / stage_backward_weight). Where a split is not clean (no input
gradient to compute, as on the first stage, or a parameter reached by two branches)
B runs the whole backward and W has nothing left to do: slower, never wrong.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor
from torch.autograd.graph import GradientEdge, Node, get_gradient_edge

from distcourse.arguments import positive_int
from distcourse.parallel.pipeline.schedules import Action, Schedule, check


def backward_input(
    out: Tensor, grad: Tensor | None, inp: Tensor, params: Sequence[Tensor]
) -> Callable[[], None]:
    """B: put d out / d inp into inp.grad now; return W, which accumulates the
    parameters' gradients into their .grad when called (once)."""
    params = [p for p in params if p.requires_grad]
    groups = _groups(out, inp, params) if inp.requires_grad else None
    if groups is None:  # no clean split: the whole backward now
        torch.autograd.backward(out, grad)
        return lambda: None
    caught: dict[Node, tuple] = {}
    # each hook returns None: the gradient goes on unchanged
    hooks = [
        node.register_prehook(lambda grads, node=node: caught.__setitem__(node, grads))
        for node in groups
    ]
    try:
        (inp.grad,) = torch.autograd.grad(out, inp, grad, retain_graph=True)
    finally:
        for hook in hooks:
            hook.remove()

    # W keeps the graph alive through its root: a custom autograd.Function's node is
    # held only by the nodes after it (its Python object holds it weakly on torch
    # 2.11), so without `root` it would be gone once the caller drops `out`
    root = out.grad_fn

    def weight() -> None:
        assert root is not None  # held until W has run
        for node, mine in groups.items():
            edges = [
                (GradientEdge(node, i), arrived)
                for i, arrived in enumerate(caught[node])
                if arrived is not None
            ]
            outs = [edge for edge, _ in edges]
            arrived = [grad for _, grad in edges]
            grads = torch.autograd.grad(outs, mine, arrived, retain_graph=True)
            for p, new in zip(mine, grads, strict=True):
                p.grad = new if p.grad is None else p.grad + new

    return weight


def _groups(out: Tensor, inp: Tensor, params: list[Tensor]) -> dict | None:
    """{node on the input's path: the parameters behind its other branches}, or None
    if that does not cover every parameter exactly once."""
    if out.grad_fn is None:
        return None
    target = get_gradient_edge(inp).node
    owner = {get_gradient_edge(p).node: p for p in params}
    on_path: dict[Node, bool] = {}  # node -> does it lead to the input?
    below: dict[Node, list[Node]] = {}  # node -> parameter nodes it leads to

    def visit(node: Node) -> None:  # post-order, without recursion
        stack = [(node, False)]
        while stack:
            n, done = stack.pop()
            if n in on_path:
                continue
            kids = [k for k, _ in n.next_functions if k is not None]
            if not done:
                stack += [(n, True)] + [(k, False) for k in kids if k not in on_path]
                continue
            on_path[n] = n == target or any(on_path[k] for k in kids)
            found = {n} if n in owner else set()
            for k in kids:
                found.update(below[k])
            below[n] = list(found)

    visit(out.grad_fn)
    if not on_path[out.grad_fn]:
        return None
    groups: dict[Node, list[Tensor]] = {}
    for n, leads in on_path.items():
        side = (
            {
                q
                for k, _ in n.next_functions
                if k is not None and not on_path[k]
                for q in below[k]
            }
            if leads
            else set()
        )
        if side:
            groups[n] = [owner[q] for q in side]
    seen = [p for mine in groups.values() for p in mine]
    reached = {q for q in below[out.grad_fn]}
    if len(seen) != len({id(p) for p in seen}) or len(seen) != len(reached):
        return None
    return groups


def zb_h1(p: int, m: int) -> Schedule:
    """ZB-H1 as per-rank action lists. Rank r runs p - r warm-up forwards, then for
    each micro-batch i a B, the W of micro-batch i - r, and the next forward; its last
    r W's come at the end, where 1F1B's rank r would wait for gradients. Every rank
    then holds at most p micro-batches (forward done, W not yet): 1F1B's peak, which
    1F1B reaches on rank 0 only. The formula zb_h1_bubble assumes m >= p."""
    positive_int(p, "ZB-H1: ranks")
    positive_int(m, "ZB-H1: micro_batches")
    acts = []
    for r in range(p):
        warm = min(p - r, m)
        seq = [Action("F", r, j) for j in range(warm)]
        for i in range(m):
            seq.append(Action("B", r, i))
            if i >= r:
                seq.append(Action("W", r, i - r))
            if warm + i < m:
                seq.append(Action("F", r, warm + i))
        seq += [Action("W", r, j) for j in range(max(m - r, 0), m)]
        acts.append(tuple(seq))
    schedule = Schedule("ZB-H1", p, m, 1, tuple(acts))
    check(schedule)
    return schedule


def zb_h1_bubble(
    p: int, m: int, f: float = 1.0, b: float = 1.0, w: float = 1.0
) -> float:
    """ZB-H1's idle share: (p - 1)(f + b - w) idle per rank against m(f + b + w)
    work (the paper's, for w <= f + b); with f = b = w, (p - 1) / (3m + p - 1)."""
    idle = (p - 1) * (f + b - w)
    return idle / (m * (f + b + w) + idle)
