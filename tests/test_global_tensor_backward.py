"""The backward pass of global tensors (chapter 7) on real gloo ranks.

Every op rule's backward under every input signature, on 1-D and 2-D placements:
the value and every input's gradient equal one process, and each leaf's gradient
has the leaf's signature (P boxed to B). A property test (hypothesis) draws small
random programs of global ops and conversions with random signatures and
grad_sbp, and checks the same. Ranks are spawned once per world size; hypothesis
runs inside every rank with `derandomize=True`, so every rank draws the same
programs, and without shrinking (a shrink could diverge between ranks and hang).
Bad input raises the same ValueError on every rank, before any collective.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from helpers import ints, linear
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from torch import Tensor

import distcourse.global_tensor as gt
from distcourse.comm.ledger import Ledger
from distcourse.global_tensor.duality import placed
from distcourse.global_tensor.tensor import default_grad_sbp
from distcourse.launch import spawn

S0, S1 = gt.sbp.split(0), gt.sbp.split(1)
B, P = gt.sbp.broadcast, gt.sbp.partial_sum
ONE_D = [(S0,), (S1,), (B,), (P,)]
TWO_D = [(S0, S1), (B, S0), (P, B), (S1, P), (S0, S0), (B, B)]
EXAMPLES = {2: 20, 4: 10}  # hypothesis examples per placement, by world size


def _ce(x: Tensor, t: Tensor) -> Tensor:
    return F.cross_entropy(x, (t.abs() % x.shape[1]).long())


# every op rule (rules.py, reductions.py): (fn, input shapes, inputs with a gradient)
OPS: dict[str, tuple[Callable, list, int]] = {
    "add": (torch.add, [(4, 4), (4, 4)], 2),
    "add row": (torch.add, [(4, 4), (4,)], 2),
    "sub": (torch.sub, [(4, 4), (4, 4)], 2),
    "mul": (torch.mul, [(4, 4), (4, 4)], 2),
    "div": (lambda a, b: a / (b.abs() + 1), [(4, 4), (4, 4)], 2),
    "neg, scale": (lambda a: -a * 0.5, [(4, 4)], 1),
    "plus 1": (lambda a: a + 1, [(4, 4)], 1),
    "relu": (torch.relu, [(4, 4)], 1),
    "gelu": (F.gelu, [(4, 4)], 1),
    "tanh, sigmoid": (lambda a: torch.tanh(a) + torch.sigmoid(a), [(4, 4)], 1),
    "mm": (torch.mm, [(4, 4), (4, 4)], 2),
    "linear": (linear, [(4, 4), (4, 4), (4,)], 3),
    "t": (lambda a: a.t() * 1, [(4, 4)], 1),
    "permute 3-D": (lambda a: a.permute(2, 0, 1) * 1, [(4, 4, 2)], 1),
    "unsqueeze": (lambda a: a.unsqueeze(1) * 1, [(4, 4)], 1),
    "view": (lambda a: a.view(4, 2, 2) * 1, [(4, 4)], 1),
    "expand": (lambda a: a.unsqueeze(0).expand(2, 4, 4) * 1, [(4, 4)], 1),
    "sum": (torch.sum, [(4, 4)], 1),
    "sum dim": (lambda a: a.sum(1), [(4, 4)], 1),
    "mean dim": (lambda a: a.mean(0, keepdim=True), [(4, 4)], 1),
    "mse_loss": (F.mse_loss, [(4, 4), (4, 4)], 2),
    "softmax": (lambda a: torch.softmax(a, 1), [(4, 4)], 1),
    "cross_entropy": (_ce, [(4, 4), (4,)], 1),
}


def _sigs(sig: tuple, shape: tuple[int, ...]) -> tuple:
    """`sig` for a tensor of `shape`: a split past its dims becomes B."""
    return tuple(B if s in (S0, S1) and s.dim >= len(shape) else s for s in sig)


def _check_op(name: str, sigs: list[tuple], p: gt.Placement) -> list[str]:
    fn, shapes, n_grad = OPS[name]
    wholes = [ints(s, 7 + i) for i, s in enumerate(shapes)]
    refs = [w.clone().requires_grad_(i < n_grad) for i, w in enumerate(wholes)]
    ref = fn(*refs)
    weight = ints(tuple(ref.shape), 99)
    (ref * weight).sum().backward()
    xs = [placed(w, p, _sigs(s, w.shape)) for w, s in zip(wholes, sigs, strict=True)]
    xs = [x.requires_grad_() if i < n_grad else x for i, x in enumerate(xs)]
    out = fn(*xs)
    (out * placed(weight, p, (B,) * p.ndim)).sum().backward()
    bad = []
    if not torch.allclose(out.full_tensor(), ref, atol=1e-9):
        bad.append(f"{name} {sigs}: value")
    for i, (x, r) in enumerate(zip(xs[:n_grad], refs, strict=False)):
        if x.grad.sbp != default_grad_sbp(x.sbp):
            bad.append(f"{name} {sigs}: gradient {i} is {x.grad.sbp}")
        if not torch.allclose(x.grad.full_tensor(), r.grad, atol=1e-9):
            bad.append(f"{name} {sigs}: gradient {i}")
    return bad


def _every_op(ranks: list, candidates: list[tuple]) -> list[str]:
    p = gt.placement("cpu", ranks=ranks)
    bad = []
    for name, (_, shapes, _) in OPS.items():
        for sigs in itertools.product(candidates, repeat=min(len(shapes), 2)):
            sigs = list(sigs) + [(B,) * p.ndim] * (len(shapes) - len(sigs))
            bad += _check_op(name, sigs, p)
    return bad


# ------------------------------------------------------------ property test ----

UNARY = ["relu", "tanh", "neg", "t", "scale"]
BINARY = ["add", "sub", "mul", "mm", "add_rowsum"]


def _apply(op: str, a: Tensor, b: Tensor) -> Tensor:
    """One op of a drawn program, on global or plain tensors alike."""
    table = {
        "relu": lambda: torch.relu(a),
        "tanh": lambda: torch.tanh(a),
        "neg": lambda: -a,
        "t": lambda: a.t(),
        "scale": lambda: a * 0.5,
        "add": lambda: a + b,
        "sub": lambda: a - b,
        "mul": lambda: a * b,
        "mm": lambda: a @ b,
        "add_rowsum": lambda: a + b.sum(0, keepdim=True),
    }
    return table[op]()


@st.composite
def programs(draw: Callable, sigs: list[tuple]) -> tuple:
    """Leaf signatures and a list of steps (op, operand, operand, sbp, grad_sbp)."""
    leaves = draw(st.lists(st.sampled_from(sigs), min_size=2, max_size=3))
    steps = []
    for k in range(draw(st.integers(1, 5))):
        live = len(leaves) + k
        op = draw(st.sampled_from([*UNARY, *BINARY, "to_global"]))
        a, b = draw(st.integers(0, live - 1)), draw(st.integers(0, live - 1))
        sbp = draw(st.sampled_from(sigs))
        grad = draw(st.sampled_from([None, *sigs]))
        steps.append((op, a, b, sbp, grad))
    return leaves, steps


def _run_program(leaves: list, steps: list, p: gt.Placement) -> str:
    wholes = [ints((4, 4), 20 + i) / 2 for i in range(len(leaves))]
    refs = [w.clone().requires_grad_() for w in wholes]
    xs = [placed(w, p, s).requires_grad_() for w, s in zip(wholes, leaves, strict=True)]
    ys, vs = list(xs), list(refs)
    for op, a, b, sbp, grad in steps:
        if op == "to_global":
            ys.append(ys[a].to_global(sbp=sbp, grad_sbp=grad))
            vs.append(vs[a] * 1)
        else:
            ys.append(_apply(op, ys[a], ys[b]))
            vs.append(_apply(op, vs[a], vs[b]))
    weight = ints((4, 4), 5)
    (vs[-1] * weight).sum().backward()
    (ys[-1] * placed(weight, p, (B,) * p.ndim)).sum().backward()
    if not torch.allclose(ys[-1].full_tensor(), vs[-1], atol=1e-9):
        return "value"
    for i, (x, r) in enumerate(zip(xs, refs, strict=True)):
        if r.grad is None:
            continue
        if x.grad.sbp != default_grad_sbp(x.sbp) or not torch.allclose(
            x.grad.full_tensor(), r.grad, atol=1e-9
        ):
            return f"gradient of leaf {i}"
    return ""


def _property(ranks: list, examples: int) -> int:
    p = gt.placement("cpu", ranks=ranks)
    cands = ONE_D if p.ndim == 1 else TWO_D
    seen = []

    @settings(
        derandomize=True,
        max_examples=examples,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(programs(cands))
    def check(program: tuple) -> None:
        seen.append(program)
        assert _run_program(*program, p) == "", program

    check()
    return len(seen)


# --------------------------------------------------------------- bad input ----


def _bad_input(world: int) -> list[str]:
    p = gt.placement("cpu", ranks=list(range(world)))
    x = gt.randn(4, 6, placement=p, sbp=S0, requires_grad=True)
    other = gt.placement("cpu", ranks=[[r] for r in range(world)])
    calls = {
        "non-scalar": lambda: (x * 2).backward(),
        "plain gradient": lambda: (x * 2).backward(torch.ones(4, 6)),
        "gradient shape": lambda: (x * 2).backward(gt.ones(4, 5, placement=p, sbp=B)),
        "gradient placement": lambda: (x * 2).backward(
            gt.ones(4, 6, placement=other, sbp=(B, B))
        ),
        "grad_sbp dim": lambda: x.to_global(sbp=B, grad_sbp=gt.sbp.split(2)),
        "grad_sbp entries": lambda: x.to_global(sbp=B, grad_sbp=(B, B)),
        "to_local grad_sbp": lambda: x.to_local(grad_sbp=S1),
        "plain scalar with grad": lambda: x * torch.tensor(2.0, requires_grad=True),
    }
    out = []
    for name, call in calls.items():
        with Ledger() as ledger:
            try:
                call()
                out.append(f"{name}: no error")
            except ValueError as err:
                out.append(f"{name}: {str(err)[:40]} ({ledger.bytes_sent()} B)")
    return out


# ------------------------------------------ one spawn per world size, then tests ----


def _all_of_it(world: int) -> dict[str, object]:
    """Everything a world size checks, in one spawn (ranks start once)."""
    if world == 2:
        return {
            "ops": _every_op([0, 1], ONE_D),
            "programs": _property([0, 1], EXAMPLES[2]),
            "bad input": _bad_input(2),
        }
    return {
        "ops": _every_op([[0, 1], [2, 3]], TWO_D[:4]),
        "programs": _property([0, 1, 2, 3], EXAMPLES[4]),
        "programs 2-D": _property([[0, 1], [2, 3]], EXAMPLES[4]),
        "bad input": _bad_input(4),
    }


@pytest.fixture(scope="module", params=[2, 4], ids=["2 ranks", "2x2 and 4 ranks"])
def results(request: pytest.FixtureRequest) -> tuple[int, list[dict]]:
    world = request.param
    return world, spawn(_all_of_it, world, world, timeout=60, deadline=300)


def test_every_op_rules_backward_equals_one_process(results: tuple) -> None:
    """1-D on 2 ranks (every pair of S(0), S(1), B, P), 2-D on 2 x 2."""
    world, by_rank = results
    assert [r["ops"] for r in by_rank] == [[]] * world


def test_random_programs_equal_one_process(results: tuple) -> None:
    world, by_rank = results
    for key in ("programs", "programs 2-D")[: 1 if world == 2 else 2]:
        assert [r[key] for r in by_rank] == [EXAMPLES[world]] * world


def test_bad_input_fails_alike_on_every_rank_before_any_collective(
    results: tuple,
) -> None:
    world, by_rank = results
    lines = by_rank[0]["bad input"]
    assert all(r["bad input"] == lines for r in by_rank)
    assert all(line.endswith("(0 B)") for line in lines), lines
    assert "backward() on a global tensor of shape" in lines[0]
