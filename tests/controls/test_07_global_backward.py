"""Negative controls of chapter 7: its own cells, run with a fault planted in the
global-tensor package (boxing that sums a partial tensor twice, or puts the pieces
in the wrong order; a gradient that leaves a partial sum unsummed, or leaves with
its dual) or in the chapter's code (Megatron's f replaced by g; w's gradient
declared the wrong way), must turn each verdict they print from PASS to FAIL. One
spawn of the chapter's 4 ranks runs them all (tests/controls/harness.py).
"""

from __future__ import annotations

import re

import harness
import pytest
from boxing_faults import sums_twice, wrong_order
from harness import Fault, Plant, Swap

from distcourse.global_tensor import boxing, duality, tensor

CHAPTER = harness.Chapter(
    "07_global_backward", setup=["p1 = gt.placement"], stored=True
)
CELLS = [  # the cells, by a text of each
    "costs = duality.conversion_table(p1",
    "all 60 gradients equal dy",
    "costs2 = duality.conversion_table(p2",
    "def matmul_backward(",
    'for name, args in (("data parallel"',
    "ddp = DDP(copy.deepcopy(plain)",
    'print(f"gradients {checks.verdict(d, 1e-6)}")',
    "h = duality.copy_to_parallel(xg)",
    "for g in (None, P):",
]
TABLES = [CELLS[0], CELLS[2]]


def left_as_it_came(sig: tuple) -> tuple:
    """A gradient that leaves with the SBP it arrived in: a partial one unsummed."""
    return tuple(sig)


FAULTS = {
    "sums twice": Fault(CELLS, Plant(boxing, "convert", sums_twice, wrap=True)),
    "wrong order": Fault(CELLS, Plant(boxing, "convert", wrong_order, wrap=True)),
    "P left unsummed": Fault(
        TABLES, Plant(tensor, "default_grad_sbp", left_as_it_came)
    ),
    "leaves its dual": Fault(
        TABLES, Plant(tensor, "default_grad_sbp", duality.arrives_as)
    ),
    "f as g": Fault(
        [CELLS[7], "plain, with f"],
        Swap(
            'for name, f in (("plain, with f", copy_to_group), '
            '("plain, no f", lambda t: t)):',
            'for name, f in (("plain, with f", reduce_from_group), '
            '("plain, no f", lambda t: t)):',
        ),
    ),
    "declared the wrong way": Fault(
        ["w0, data = torch.randn(5)", "def gradient(framework", "for uses, declared"],
        Swap(
            '        wl = w.to_local(grad_sbp={"P": P, "B": B}[declared])',
            '        wl = w.to_local(grad_sbp={"P": B, "B": P}[declared])',
        ),
        Swap(
            '        wl = w.to_local(grad_placements=[{"P": Partial(), "B": '
            "Replicate()}[declared]])",
            '        wl = w.to_local(grad_placements=[{"P": Replicate(), "B": '
            "Partial()}[declared]])",
        ),
    ),
}


CONTROLS = harness.Controls(
    "07_global_backward",
    test_every_conversion_row_fails_under_some_fault=harness.Flip(
        ["sums twice", "wrong order", "P left unsummed", "leaves its dual"],
        r"\| gradient PASS",
        "boxing sums a partial tensor twice, or puts pieces in the wrong order; a "
        "gradient leaves P unsummed, or leaves with its dual (B's as P)",
    ),
    test_boxing_that_sums_twice_fails=harness.Flip(
        ["sums twice"],
        r"all 60 gradients equal dy with the SBP asked for: True",
        "boxing sums a partial tensor twice",
        r"^(\[all ranks\] )?gradients <= 1e-06: PASS",
        "boxing sums a partial tensor twice: every gradient x 2 against DDP's",
        r"global: forward \d+ B, backward \d+ B; dx",
        "boxing sums a partial tensor twice: f's backward all_reduce x 2",
    ),
    test_boxing_in_the_wrong_order_fails_step_5=harness.Flip(
        ["wrong order"],
        r"B -> S\(0\), grad_sbp=\w+: .*gradient PASS",
        "boxing puts the pieces in the wrong order",
    ),
    test_each_matmul_layout_fails_under_a_boxing_fault=harness.Flip(
        ["sums twice", "wrong order"],
        r"parallel: backward sent \d+ B; .*vs one process <= 1e-05: PASS",
        "boxing sums a partial tensor twice (data, column parallel); pieces in the "
        "wrong order (row parallel)",
    ),
    test_f_replaced_by_g_fails=harness.Flip(
        ["f as g"],
        r"plain, with f: dx vs one process PASS",
        "Megatron's f replaced by g (an all_reduce forward)",
    ),
)
globals().update(CONTROLS.tests())


@pytest.mark.controls(
    "07_global_backward",
    r"(its row|all rows) +[PB] +PASS +PASS",
    fault="w's gradient declared the wrong way: a part as B, a whole as P",
)
def test_a_wrong_declaration_fails_in_both_libraries(ran: harness.Ran) -> None:
    """The two rows that pass as written (a part declared P, a whole declared B)
    say FAIL in both libraries, and why: the line ends in the reason, not in its
    verdict, so it is read here."""
    lines = ran.lines["declared the wrong way"]
    for row in (r"its row +P ", r"all rows +B "):
        (line,) = [ln for ln in lines if re.search(row, ln)]
        assert line.count("FAIL") == 2 and "PASS" not in line, line
