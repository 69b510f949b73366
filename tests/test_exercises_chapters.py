"""Every chapter's exercises: each solution passes its check, a wrong answer fails.

For each exercise of `distcourse.exercises.ch01` ... `ch10`, `ch12_experts`,
`ch12_context` and `ch13`, the solution in `distcourse.exercises.solutions` must
print PASS and return True, and the wrong answer below (a mistake a reader makes)
must print FAIL with its hint and return False. Answers that are code run on real
gloo ranks (4 of them), numbers in-process.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from distcourse import exercises
from distcourse.exercises.ch06 import MATMUL
from distcourse.exercises.ch08 import PLAN
from distcourse.parallel.pipeline.schedules import gpipe

CHAPTERS = sorted(  # every chapter module: ch01 ... ch10, and any added later
    m.name for m in pkgutil.iter_modules(exercises.__path__) if m.name[:2] == "ch"
)
ROOT = Path(__file__).resolve().parents[1]


def _summed(t: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(t)
    return t


def _summed_grads(model: nn.Module) -> None:
    for p in model.parameters():
        dist.all_reduce(p.grad)


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


def _sum_both_ways(x: torch.Tensor) -> torch.Tensor:
    return _summed(x.clone())  # no autograd: the gradient does not flow back


def _averaged_halves(out_a, lse_a, out_b, lse_b) -> tuple:  # noqa: ANN001
    """Chapter 12b's merge without rescaling: the two halves' outputs averaged."""
    return (out_a + out_b) / 2, torch.logaddexp(lse_a, lse_b)


def _never_drops(logits: torch.Tensor, room: int) -> tuple:
    """Chapter 12's top-1 routing with the capacity ignored: no token dropped."""
    expert = logits.argmax(dim=-1)
    return expert, torch.ones_like(expert, dtype=torch.bool)


def _first_to_last(sizes: list[int], cap: int) -> list[list[int]]:
    out, current, held = [], [], 0
    for i, size in enumerate(sizes):  # the model's order, not backward's
        current.append(i)
        held += size
        if held >= cap:
            out.append(current)
            current, held = [], 0
    return out + ([current] if current else [])


s, b, h, a = 2048, 1, 12288, 96
WRONG = {  # a mistake per exercise
    "ch01": {
        "average": _summed,
        "same_start": lambda model: None,
        "steps_per_epoch": 43,  # one rank's view of all 1,348 images
    },
    "ch02": {
        "ring_all_reduce": _summed,  # a collective, not messages
        "ring_reduce_scatter": lambda t: t.chunk(4)[dist.get_rank()],  # no sum
        "all_reduce_bytes": 2 * 64 * 2**20,  # 2T, the (n-1)/n forgotten
        "all_gather_bytes": 2**20,
    },
    "ch03": {
        "average_gradients": _summed_grads,
        "buckets": _first_to_last,
        "sampler_repeats": 1,  # what partition drops, not what the sampler adds
        "ddp_bytes": 10_000_000,
        "ddp_memory": 16_000_000,  # the buckets' copy forgotten
    },
    "ch04": {
        "f_g": (_sum_both_ways, _identity),  # f and g swapped, g without backward
        "column_parallel": lambda x, w, bias: x @ w.chunk(4, 1)[dist.get_rank()],
        "activation_bytes": s * b * h * 34,
        "activation_bytes_tp_sp": s * b * h * (10 + 24 / 8 + 5 * a * s / h / 8),
    },
    "ch05": {
        "bubble": 3 / 8,
        "one_f_one_b": lambda p, m: [list(map(str, r)) for r in gpipe(p, m).actions],
        "peak_in_flight": 16,
        "interleaved_transfers": 8,  # v = 1's count
    },
    "ch06": {
        "pieces": [(2, 3), (1, 3), (1, 3), (1, 3)],  # S(0)'s pieces
        "boxing_bytes": 42,  # the ring's (n-1)/n of my piece: the columns are uneven
        "matmul_sbp": {**MATMUL, "S(1) x S(0)": "B"},
        "gather_pieces": lambda piece: torch.cat([piece] * 4),
    },
    "ch07": {
        "grad_sbp": {"S(0)": "S(0)", "S(1)": "S(1)", "B": "B", "P": "B"},
        "dp_grad_bytes": 2**20,
        "row_parallel": lambda x, w: x @ w.T,  # no g: a partial sum
    },
    "ch08": {
        "groups": {"dp": [5, 7], "pp": [1, 5], "tp": [4, 5]},
        "layout": (2, 2, 2),  # 0.64 GiB on a rank
        "parameters_held": 4 * 4344,
        "dp_tp_plan": {**PLAN, "proj.weight": ("B", "S(0)")},  # split like fc's
    },
    "ch09": {
        "zero2_bytes": 16 * 10**9 // 8,
        "zero3_bytes": 16 * 10**9,
        "fsdp_rows": [3, 3, 2, 2],  # tensor_split's, not chunk's
        "reduce_scatter_grads": lambda g: g.chunk(4)[dist.get_rank()],
    },
    "ch10": {
        "mixed_precision_bytes": 20,
        "activation_memory": 2048 * 4 * 2048 * (34 + 5 * 16),  # one layer
        "recompute_memory": 24 * 4 * 2048 * 4 * 2048,  # fp32 inputs
        "zero_stage_that_fits": 2,
        "step_time": 2 * 1e9 * 2**20 / (8 * 312e12 * 0.4),
    },
    "ch12_experts": {
        "capacity": 128,  # the capacity factor forgotten
        "route_top1": _never_drops,
        "exchange_counts": lambda per_expert: per_expert.view(4, 2),  # never sent
        "dispatch_bytes": 3 * 100 * 1024 * 4 // 4,  # the ring's even share
    },
    "ch12_context": {
        "merge": _averaged_halves,
        "positions": lambda seq, cp, rank: torch.arange(seq // cp),  # from 0
        "ring_pass": _identity,  # nothing sent: its own tensor back
        "ring_bytes": 7 * 2 * 2**20,  # the forward's passes only
        "contiguous_imbalance": 1.0,  # as if every rank computed alike
    },
    "ch13": {
        "latest": lambda folder: max(folder.glob("step_*"), default=None),  # by name
        "redone_steps": 4,  # the interrupted step forgotten
        "checkpoint_bytes": 4 * 10**7,  # the model alone
        "accepted_16": 10,  # every grid of 16 into 3 factors of at most 4 blocks
    },
}


def _modules(chapter: str) -> tuple:
    return (
        importlib.import_module(f"distcourse.exercises.{chapter}"),
        importlib.import_module(f"distcourse.exercises.solutions.{chapter}"),
    )


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_check_is_listed_and_has_a_solution_and_a_wrong_answer(chapter) -> None:
    checks, solutions = _modules(chapter)
    defined = {
        name.removeprefix("check_")
        for name, fn in inspect.getmembers(checks, inspect.isfunction)
        if name.startswith("check_") and fn.__module__ == checks.__name__
    }
    assert set(checks.EXERCISES) == defined, "EXERCISES lists every check"
    assert len(checks.EXERCISES) >= 3
    assert all(hasattr(solutions, name) for name in checks.EXERCISES)
    assert set(WRONG[chapter]) == defined


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_solutions_pass_and_wrong_answers_fail_with_a_hint(chapter, capsys) -> None:
    checks, solutions = _modules(chapter)
    for name in checks.EXERCISES:
        check = getattr(checks, f"check_{name}")
        assert check(getattr(solutions, name)) is True, capsys.readouterr().out
        assert capsys.readouterr().out == f"{chapter}.{name}: PASS\n"
        assert check(WRONG[chapter][name]) is False, name
        line = capsys.readouterr().out
        assert line.startswith(f"{chapter}.{name}: FAIL — ") and " — hint: " in line
        assert line.count("\n") == 1 and "Traceback" not in line, line
        assert check(None) is False
        assert "not answered yet — hint: " in capsys.readouterr().out


def test_every_chapter_from_1_to_10_has_its_exercises() -> None:
    assert {f"ch{n:02d}" for n in range(1, 11)} <= set(CHAPTERS)


def test_the_appendix_shows_every_chapters_exercises_and_folds_its_solutions() -> None:
    page = (ROOT / "book" / "appendix_solutions.md").read_text()
    for chapter in CHAPTERS:
        assert f"literalinclude}} ../distcourse/exercises/{chapter}.py" in page
        assert f"dropdown}} Solutions: distcourse/exercises/solutions/{chapter}" in page
    assert "book/appendix_solutions" in (ROOT / "_toc.yml").read_text()
