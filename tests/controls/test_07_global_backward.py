"""Negative controls for chapter 7's verdicts: each check the chapter prints, run on
a planted fault, prints FAIL / False.

The faults are planted in the global-tensor package for the length of one call,
then undone: boxing that sums a partial tensor twice (the classic gradient x 2),
boxing that puts pieces in the wrong order, and a gradient that leaves with the
wrong signature (a partial gradient left unsummed; a broadcast one left P, its
dual, instead of B). Megatron's f is replaced by g, and w's gradient is declared
the wrong way (step 5). One spawn of 4 ranks runs them all.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
from collections.abc import Callable, Iterator

import pytest
import torch
import torch.distributed as dist
from torch import Tensor, nn

import distcourse.global_tensor as gt
from distcourse import checks
from distcourse.comm.autograd import reduce_from_group
from distcourse.global_tensor import boxing, duality, tensor
from distcourse.global_tensor.sbp import Split
from distcourse.launch import spawn
from distcourse.parallel.ddp import DDP

S0, S1 = gt.sbp.split(0), gt.sbp.split(1)
B, P = gt.sbp.broadcast, gt.sbp.partial_sum
CONVERSIONS = [  # chapter 7, step 1: (x, y, dy arrives as, grad_sbp)
    (S0, B, P, None),
    (S0, B, B, None),
    (P, B, B, None),
    (B, S0, None, None),
    (B, S0, None, P),
    (S0, S1, None, None),
    (P, S0, None, None),
    (B, P, None, None),
    (S0, P, None, None),
]
TWO_D = [  # step 2, on the 2 x 2 placement
    ((S0, S1), (B, B), None, None),
    ((B, B), (S0, S1), None, None),
    ((B, B), (S0, S1), None, (P, P)),
    ((P, P), (B, S0), None, None),
    ((S0, B), (B, S1), None, None),
]


def _sums_twice(convert: Callable) -> Callable:
    def faulty(x: Tensor, pl, dim, src, dst, size) -> Tensor:  # noqa: ANN001
        out = convert(x, pl, dim, src, dst, size)
        return out * 2 if src == P and dst != P else out

    return faulty


def _wrong_order(convert: Callable) -> Callable:
    def faulty(x: Tensor, pl, dim, src, dst, size) -> Tensor:  # noqa: ANN001
        out = convert(x, pl, dim, src, dst, size)
        split = dst if isinstance(dst, Split) else src
        if isinstance(split, Split) and src != dst:
            return torch.flip(out, [split.dim])
        return out

    return faulty


@contextlib.contextmanager
def _fault(name: str) -> Iterator[None]:
    """Plant one fault in the package for the block, then put it back."""
    convert, grad_sbp = boxing.convert, tensor.default_grad_sbp
    if name == "sums twice":
        boxing.convert = _sums_twice(convert)
    elif name == "wrong order":
        boxing.convert = _wrong_order(convert)
    elif name == "P left unsummed":
        tensor.default_grad_sbp = lambda sig: tuple(sig)
    elif name == "leaves its dual":
        tensor.default_grad_sbp = duality.arrives_as
    try:
        yield
    finally:
        boxing.convert, tensor.default_grad_sbp = convert, grad_sbp


FAULTS = ["sums twice", "wrong order", "P left unsummed", "leaves its dual"]


def _rows(p1: gt.Placement, p2: gt.Placement) -> dict[str, list[str]]:
    """Steps 1, 2 and 5: every row of the tables under each fault."""
    out = {}
    for name in FAULTS:
        with _fault(name):
            one = duality.conversion_table(p1, (8, 6), CONVERSIONS)
            two = duality.conversion_table(p2, (8, 6), TWO_D)
            out[name] = [c.row() for c in one + two]
    with _fault("sums twice"):
        right = True
        for src, dst in itertools.permutations([S0, S1, B, P], 2):
            for g in (None, S0, S1, B, P):
                cost = duality.conversion_cost(p1, (8, 6), src, dst, grad_sbp=g)
                right &= cost.correct
        out["60"] = [f"all 60 gradients equal dy with the SBP asked for: {right}"]
    with _fault("wrong order"):
        out["step 5"] = []
        for g in (None, P):
            c = duality.conversion_cost(p1, (8, 6), B, S0, grad_sbp=g)
            ok = "PASS" if c.correct else "FAIL"
            out["step 5"].append(f"B -> S(0), grad_sbp={g}: gradient {ok}")
    return out


def _matmul_backward(p1: gt.Placement, x_sbp, w_sbp, to=None) -> float:  # noqa: ANN001
    """Step 3's check: one matmul's gradients against one process."""
    torch.manual_seed(0)
    x, w, c = (torch.randn(*s) for s in ((8, 6), (6, 4), (8, 4)))
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    ((xr @ wr) * c).sum().backward()
    xg = gt.to_global(x, p1, B).to_global(sbp=x_sbp).detach().requires_grad_()
    wg = gt.to_global(w, p1, B).to_global(sbp=w_sbp).detach().requires_grad_()
    y = xg @ wg if to is None else (xg @ wg).to_global(sbp=to)
    cg = gt.to_global(c, p1, B).to_global(sbp=y.sbp if y.sbp != (P,) else B)
    (y * cg).sum().backward()
    return max(
        (xg.grad.full_tensor() - xr.grad).abs().max().item(),
        (wg.grad.full_tensor() - wr.grad).abs().max().item(),
    )


def _steps_3_and_4(p1: gt.Placement) -> list[str]:
    lines = []
    layouts = (("data parallel", (S0, B)), ("column parallel", (B, S1)))
    with _fault("sums twice"):
        for name, args in layouts:
            d = _matmul_backward(p1, *args)
            lines.append(f"{name}: vs one process {checks.verdict(d, 1e-5)}")
    with _fault("wrong order"):
        d = _matmul_backward(p1, S1, S0, B)
        lines.append(f"row parallel: vs one process {checks.verdict(d, 1e-5)}")

    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(10, 10), nn.ReLU(), nn.Linear(10, 5))
    x, y = torch.randn(16, 10), torch.randn(16, 5)
    ddp = DDP(copy.deepcopy(plain), init_sync=False)
    mine = slice(4 * dist.get_rank(), 4 * dist.get_rank() + 4)
    nn.functional.mse_loss(ddp(x[mine]), y[mine]).backward()
    with _fault("sums twice"):
        model = gt.to_global(plain, p1, B)
        xg, yg = (gt.to_global(t, p1, B).to_global(sbp=S0) for t in (x, y))
        nn.functional.mse_loss(model(xg), yg).backward()
        d = max(
            (a.grad.full_tensor() - b.grad).abs().max().item()
            for a, b in zip(model.parameters(), ddp.module.parameters(), strict=True)
        )
    lines.append(f"gradients {checks.verdict(d, 1e-6)}")

    torch.manual_seed(0)
    a, b, x = (torch.randn(*s) for s in ((8, 4), (4, 8), (3, 4)))
    xr = x.clone().requires_grad_()
    (torch.relu(xr @ a.t()) @ b.t()).sum().backward()
    w1 = gt.to_global(a, p1, B).to_global(sbp=S0)
    w2 = gt.to_global(b, p1, B).to_global(sbp=S1)
    with _fault("sums twice"):
        xg = gt.to_global(x, p1, B).detach().requires_grad_()
        h = duality.copy_to_parallel(xg)
        out = duality.reduce_from_parallel(torch.relu(h @ w1.t()) @ w2.t())
        out.sum().backward()
        d = (xg.grad.full_tensor() - xr.grad).abs().max().item()
    lines.append(f"global: dx {xg.grad.sbp} {checks.verdict(d, 1e-5)}")

    xl = x.clone().requires_grad_()  # f replaced by g: an all_reduce forward
    h = torch.relu(reduce_from_group(xl) @ w1.to_local().t())
    reduce_from_group(h @ w2.to_local().t()).sum().backward()
    d = checks.max_over_ranks((xl.grad - xr.grad).abs().max().item())
    lines.append(f"plain, with f: dx vs one process {'PASS' if d <= 1e-5 else 'FAIL'}")
    return lines


def _declared(p1: gt.Placement) -> list[str]:
    """Step 5's check, w's gradient declared the wrong way, ours and DTensor's."""
    from torch.distributed.tensor import (
        Partial,
        Replicate,
        distribute_tensor,
        init_device_mesh,
    )

    mesh = init_device_mesh("cpu", (4,))
    torch.manual_seed(0)
    w0, data = torch.randn(5), torch.randn(4, 5)
    want = data.sum(0)
    lines = []
    for uses, declared in (("its row", "B"), ("all rows", "P")):
        verdicts = []
        for framework in ("ours", "DTensor"):
            if framework == "ours":
                w = gt.to_global(w0, p1, B).detach().requires_grad_()
                wl = w.to_local(grad_sbp={"P": P, "B": B}[declared])
            else:
                w = distribute_tensor(w0, mesh, [Replicate()]).requires_grad_()
                place = {"P": Partial(), "B": Replicate()}[declared]
                wl = w.to_local(grad_placements=[place])
            rows = data[dist.get_rank()] if uses == "its row" else data.sum(0)
            (wl * rows).sum().backward()
            d = checks.max_over_ranks((w.grad.full_tensor() - want).abs().max().item())
            verdicts.append("PASS" if d <= 1e-5 else "FAIL")
        lines.append(f"{uses:<22} {declared:<9} {verdicts[0]:<21} {verdicts[1]}")
    return lines


def _faults() -> dict[str, list[str]]:
    torch.set_num_threads(1)
    p1 = gt.placement("cpu", ranks=[0, 1, 2, 3])
    p2 = gt.placement("cpu", ranks=[[0, 1], [2, 3]])
    found = _rows(p1, p2)
    found["steps 3 and 4"] = _steps_3_and_4(p1)
    found["declared"] = _declared(p1)
    return found


@pytest.fixture(scope="module")
def lines() -> list[dict[str, list[str]]]:
    """Every rank's lines for every fault (one spawn for the whole file)."""
    return spawn(_faults, 4, timeout=120)


@pytest.mark.controls(
    "07_global_backward",
    r"\| gradient PASS",
    fault="boxing sums a partial tensor twice, or puts pieces in the wrong order; a "
    "gradient leaves P unsummed, or leaves with its dual (B's as P)",
)
def test_every_conversion_row_fails_under_some_fault(lines: list) -> None:
    rows = lines[0]
    count = len(CONVERSIONS) + len(TWO_D)
    for i in range(count):
        failed = [f for f in FAULTS if rows[f][i].endswith("gradient FAIL")]
        assert failed, f"row {i} passes under every fault: {rows[FAULTS[0]][i]}"


@pytest.mark.controls(
    "07_global_backward",
    r"all 60 gradients equal dy with the SBP asked for: True",
    fault="boxing sums a partial tensor twice",
)
@pytest.mark.controls(
    "07_global_backward",
    r"B -> S\(0\), grad_sbp=\w+: .*gradient PASS",
    fault="boxing puts the pieces in the wrong order",
)
def test_the_grad_sbp_table_and_step_5_fail(lines: list) -> None:
    for rank_lines in lines:
        assert rank_lines["60"][0].endswith(": False")
    assert all(ln.endswith("FAIL") for ln in lines[0]["step 5"])


@pytest.mark.controls(
    "07_global_backward",
    r"parallel: backward sent \d+ B; .*vs one process <= 1e-05: PASS",
    fault="boxing sums a partial tensor twice (data, column parallel); pieces in "
    "the wrong order (row parallel)",
)
@pytest.mark.controls(
    "07_global_backward",
    r"^(\[all ranks\] )?gradients <= 1e-06: PASS",
    fault="boxing sums a partial tensor twice: every gradient x 2 against DDP's",
)
@pytest.mark.controls(
    "07_global_backward",
    r"global: forward \d+ B, backward \d+ B; dx",
    fault="boxing sums a partial tensor twice: f's backward all_reduce x 2",
)
@pytest.mark.controls(
    "07_global_backward",
    r"plain, with f: dx vs one process PASS",
    fault="Megatron's f replaced by g (an all_reduce forward)",
)
def test_matmul_ddp_and_megatron_checks_fail(lines: list) -> None:
    for rank_lines in lines:
        got = rank_lines["steps 3 and 4"]
        assert len(got) == 6 and all(ln.endswith("FAIL") for ln in got), got


@pytest.mark.controls(
    "07_global_backward",
    r"(its row|all rows) +[PB] +PASS +PASS",
    fault="w's gradient declared the wrong way: a part as B, a whole as P",
)
def test_a_wrong_declaration_fails_in_both_libraries(lines: list) -> None:
    for rank_lines in lines:
        for line in rank_lines["declared"]:
            assert line.split()[-2:] == ["FAIL", "FAIL"], line
