"""Chapters 8 and 8b's exercises: a rank's groups, a layout that fits, the plan.

1. `check_groups(x)`: in `Layout(dp=2, pp=2, tp=2)` (rank = 4d + 2p + t), the ranks
   of each of rank 5's groups: a dict {'dp': [...], 'pp': [...], 'tp': [...]}.
2. `check_layout(x)`: a layout (dp, pp, tp) for 8 ranks, two machines of 4 GPUs,
   that trains `MODEL` with at most 0.5 GiB of model state per rank
   (`hybrid.memory_per_rank`: 16 bytes per parameter held) and keeps tensor
   parallelism inside a machine: a tuple or a `Layout`.
3. `check_parameters_held(x)`: parameters a rank of pipeline stage 0 holds for the
   book's tiny GPT (`GPTConfig()`) under `Layout(dp=1, pp=2, tp=4)`.
4. `check_dp_tp_plan(table)` (8b): the DP x TP plan of chapter 8b's MLP (`fc`, then
   `proj`) on a 2 x 2 placement
   (mesh dimension 0 data parallel, 1 tensor parallel), nn.Linear's (out, in) layout:
   for each key of `PLAN`, its signature as a pair, e.g. ('S(0)', 'B').
"""

from __future__ import annotations

from collections import OrderedDict

from torch import nn

from distcourse.examples.gpt import GPTConfig
from distcourse.exercises.ch06 import MATMUL
from distcourse.exercises.core import (
    Problem,
    check_answer,
    check_number,
    check_table,
    plain,
)
from distcourse.global_tensor.layouts import DATA, dp_tp_plan
from distcourse.parallel.hybrid.cost import memory_per_rank, parameters_held
from distcourse.parallel.hybrid.layout import Layout, check

EXERCISES = ("groups", "layout", "parameters_held", "dp_tp_plan")
MODEL = GPTConfig(vocab=32000, block_size=1024, n_layer=8, n_head=16, n_embd=1024)
BUDGET, NODE = 2**29, 4  # bytes of model state per rank; GPUs per machine


def _times(x: tuple[str, ...], weight: tuple[str, ...]) -> tuple[str, ...]:
    """The signature of `x @ weight.T` (nn.Linear's product): chapter 6's matmul
    rule (`ch06.MATMUL`) on each mesh dimension, the weight's split transposed."""
    flip = {"S(0)": "S(1)", "S(1)": "S(0)"}
    pairs = zip(x, weight, strict=True)
    return tuple(MATMUL[f"{a} x {flip.get(w, w)}"] for a, w in pairs)


def _plan() -> dict[str, tuple[str, ...]]:
    """Chapter 8b's plan of its MLP, from the code the chapter runs: the
    parameters' signatures as `layouts.dp_tp_plan` writes them (fc column-, proj
    row-parallel), the data's (`layouts.DATA`), and each product's by `_times`.
    The solution, written out by hand, checks them."""
    mlp = nn.Sequential(OrderedDict(fc=nn.Linear(4, 8), proj=nn.Linear(8, 4)))
    plan = dp_tp_plan(mlp, column=["fc"], row=["proj"])
    sig = {name: tuple(map(repr, s)) for name, s in plan.items()}
    data = tuple(map(repr, DATA))
    hidden = _times(data, sig["fc.weight"])
    return {
        "data": data,
        "fc.weight": sig["fc.weight"],
        "fc.bias": sig["fc.bias"],
        "hidden": hidden,
        "proj.weight": sig["proj.weight"],
        "proj output before its bias": _times(hidden, sig["proj.weight"]),
        "proj.bias": sig["proj.bias"],
    }


PLAN = _plan()  # each key's signature on the 2 x 2 placement, e.g. ("S(0)", "B")


def _groups(layout: Layout, rank: int) -> dict[str, list[int]]:
    """The ranks that share all coordinates but one with `rank`, per axis."""
    grid = layout.grid()
    d, p, t = next(
        (d, p, t)
        for d in range(layout.dp)
        for p in range(layout.pp)
        for t in range(layout.tp)
        if grid[d][p][t] == rank
    )
    return {
        "dp": [grid[i][p][t] for i in range(layout.dp)],
        "pp": [grid[d][i][t] for i in range(layout.pp)],
        "tp": list(grid[d][p]),
    }


def _judge_groups(answer: object) -> Problem:
    want = _groups(Layout(2, 2, 2), 5)
    if not isinstance(answer, dict):
        return f"expected a dict with keys {list(want)}, got {type(answer).__name__}"
    for axis, ranks in want.items():
        got = answer.get(axis)
        if not isinstance(got, list | tuple | set):
            return f"no list of ranks for {axis!r}"
        if sorted(plain(list(got))) != ranks:
            return f"rank 5's {axis} group is not {sorted(got)}"
    return None


def check_groups(answer: object) -> bool:
    """Rank 5's dp, pp and tp groups in a 2x2x2 layout: a dict of rank lists."""
    return check_answer(
        "ch08.groups",
        answer,
        _judge_groups,
        hint="rank 5 = 4*1 + 2*0 + 1: (d, p, t) = (1, 0, 1); a group holds the ranks "
        "that differ from it in that one coordinate only",
    )


def _judge_layout(answer: object) -> Problem:
    if isinstance(answer, tuple | list) and len(answer) == 3:
        try:
            answer = Layout(*answer)
        except (TypeError, ValueError) as err:
            return f"not a layout: {err}"
    if not isinstance(answer, Layout):
        return f"expected (dp, pp, tp) or a Layout, got {answer!r:.60}"
    try:
        check(answer, MODEL, 8)
    except ValueError as err:
        return str(err)
    if answer.tp > NODE:
        return f"tp={answer.tp} spans machines: its all-reduces would cross the network"
    worst = max(memory_per_rank(answer, MODEL, s) for s in range(answer.pp))
    if worst > BUDGET:
        return f"{answer.name} holds {worst / 2**30:.2f} GiB on its fullest rank"
    return None


def check_layout(answer: object) -> bool:
    """A layout of 8 ranks for MODEL, tp inside a machine, <= 0.5 GiB a rank."""
    return check_answer(
        "ch08.layout",
        answer,
        _judge_layout,
        hint="data parallelism copies the whole model state; only pp and tp divide "
        "it: make pp x tp as large as the rules allow (tp <= 4, n_layer % pp == 0), "
        "and compare hybrid.memory_per_rank for each stage",
    )


def check_parameters_held(answer: object) -> bool:
    """Parameters on a stage-0 rank, GPTConfig(), Layout(1, 2, 4): a number."""
    return check_number(
        "ch08.parameters_held",
        answer,
        parameters_held(Layout(1, 2, 4), GPTConfig(), 0),
        hint="stage 0 holds n_layer / pp blocks, the token embedding split by tp "
        "and the positions whole; in a block, the split weights / tp, and the "
        "norms and the row-parallel biases whole",
    )


def check_dp_tp_plan(answer: object) -> bool:
    """The DP x TP plan: a signature per key of PLAN, each a pair of SBPs."""
    return check_table(
        "ch08.dp_tp_plan",
        answer,
        PLAN,
        hint="dimension 0 splits the data's rows and keeps weights whole (B); "
        "dimension 1 splits fc by output features (dim 0 of its weight) and proj "
        "by input features (dim 1), which leaves proj's product a partial sum",
    )
