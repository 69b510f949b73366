"""Chapter 4's exercises: Megatron's f and g, a column-parallel layer, activations.

1. `check_f_g((f, g))`: Megatron's pair as two functions of a tensor: f is the
   identity forward and all-reduces the gradient; g all-reduces forward and passes
   the gradient through. Checked inside a column- then row-parallel MLP on 4 ranks:
   output, input gradient and weight gradients against one process.
2. `check_column_parallel(fn)`: `fn(x, weight, bias)` with the whole `weight` (out,
   in) and `bias` returns this rank's slice of the output of a column-parallel
   Linear (its out_features split evenly over the ranks, rank r the r-th); 4 ranks.
3. `check_activation_bytes(x)`: bytes of one transformer layer's activations at 16
   bits (Korthikanti et al.) for s = 2048, b = 1, h = 12288, a = 96, no parallelism.
4. `check_activation_bytes_tp_sp(x)`: the same layer with tensor parallelism t = 8
   and sequence parallelism.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.nn import functional as F

from distcourse.exercises.core import (
    Problem,
    call,
    check_number,
    check_on_ranks,
    compare,
    functions,
)
from distcourse.parallel.tensor.memory import korthikanti_bytes

EXERCISES = ("f_g", "column_parallel", "activation_bytes", "activation_bytes_tp_sp")
GPT3_LAYER = dict(batch=1, seq=2048, width=12288, heads=96)


def _weights() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    x, w1, w2 = (torch.randn(s, generator=g) for s in [(3, 4), (8, 4), (4, 8)])
    return x, w1, w2


def f_g_probe(answer: object) -> Problem:
    """On each rank: y = g(relu(f(x) W1_r^T) W2_r^T) against one process's MLP."""
    f, g = answer  # type: ignore[misc]
    rank, world = dist.get_rank(), dist.get_world_size()
    x, w1, w2 = _weights()
    c = torch.arange(12.0).reshape(3, 4)  # the loss weights every output differently
    ref = [t.clone().requires_grad_() for t in (x, w1, w2)]
    (F.relu(ref[0] @ ref[1].T) @ ref[2].T * c).sum().backward()
    xr = x.clone().requires_grad_()
    w1r = w1.chunk(world, 0)[rank].clone().requires_grad_()
    w2r = w2.chunk(world, 1)[rank].clone().requires_grad_()
    h = F.relu(call(f, xr, what="f") @ w1r.T)
    y = call(g, h @ w2r.T, what="g")
    problem = compare(y, F.relu(x @ w1.T) @ w2.T, "the MLP's output")
    if problem:
        return problem + " (forward: which of f and g sums?)"
    call(lambda: (y * c).sum().backward(), what="backward through f and g")
    checks = [
        (xr.grad, ref[0].grad, "the input's gradient"),
        (w1r.grad, ref[1].grad.chunk(world, 0)[rank], "W1's gradient"),
        (w2r.grad, ref[2].grad.chunk(world, 1)[rank], "W2's gradient"),
    ]
    return next(filter(None, (compare(*c, atol=1e-4) for c in checks)), None)


def check_f_g(answer: object) -> bool:
    """`answer = (f, g)`, each a function of one tensor; 4 gloo ranks."""
    return check_on_ranks(
        "ch04.f_g",
        answer,
        f_g_probe,
        4,
        form=functions(2),
        hint="two torch.autograd.Function classes: f's forward returns x, its "
        "backward all-reduces the gradient; g's forward all-reduces a clone of x, "
        "its backward returns the gradient unchanged",
    )


def column_parallel_probe(answer: object) -> Problem:
    """On each rank: the answer's output slice against the whole output's."""
    rank, world = dist.get_rank(), dist.get_world_size()
    x, w, _ = _weights()
    b = torch.arange(8.0)
    out = call(answer, x, w, b)
    return compare(out, (x @ w.T + b).chunk(world, -1)[rank], "the output slice")


def check_column_parallel(answer: object) -> bool:
    """`answer(x, weight, bias) -> this rank's output columns`; 4 gloo ranks."""
    return check_on_ranks(
        "ch04.column_parallel",
        answer,
        column_parallel_probe,
        4,
        hint="a column-parallel Linear keeps rows rank*k .. (rank+1)*k of the "
        "weight (out_features is dim 0) and the same slice of the bias: "
        "F.linear(x, w.chunk(n, 0)[rank], b.chunk(n)[rank]); no message is needed",
    )


def check_activation_bytes(answer: object) -> bool:
    """Bytes of one GPT-3 layer's activations, s=2048 b=1 h=12288 a=96: a number."""
    return check_number(
        "ch04.activation_bytes",
        answer,
        korthikanti_bytes(**GPT3_LAYER),
        hint="sbh(34 + 5as/h): 34 bytes per element of the s x b x h activations, "
        "and 5as/h for the attention scores, softmax and its dropout mask",
    )


def check_activation_bytes_tp_sp(answer: object) -> bool:
    """The same layer's bytes per rank with t = 8 and sequence parallelism."""
    return check_number(
        "ch04.activation_bytes_tp_sp",
        answer,
        korthikanti_bytes(**GPT3_LAYER, tp=8, sp=True),
        hint="with sequence parallelism every term is split over the t ranks: "
        "sbh/t (34 + 5as/h); tensor parallelism alone leaves 10 sbh whole",
    )
