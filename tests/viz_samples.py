"""One small call of every figure function of distcourse.viz, for the tests that
hold every figure to the book's rules (tests/test_viz_figure.py): readable at the
size the book shows it. WIDE names the figures the book shows at the full width."""

from __future__ import annotations

from collections.abc import Callable

import torch
from matplotlib.figure import Figure

from distcourse import viz
from distcourse.global_tensor.duality import Cost
from distcourse.parallel.pipeline import schedules


def _costs() -> list[Cost]:
    return [
        Cost("S(0)", "B", "P", "S(0)", "all_gather", "reduce_scatter", 168, 144, True),
        Cost("P", "B", "B", "B", "all_reduce", "nothing", 288, 0, True),
        Cost("B", "S(0)", "S(0)", "B", "nothing", "all_gather", 0, 144, True),
    ]


def _layouts() -> list[dict]:
    names = ["8x1x1", "4x2x1", "4x1x2", "2x2x2", "2x1x4", "1x8x1", "1x1x8"]
    return [
        dict(layout=n, step_ms=3.0 + i, memory_kib=10.0 + i, activations_kib=4.0)
        for i, n in enumerate(names)
    ]


def _gantt() -> list[list[tuple[str, float, float]]]:
    out = schedules.simulate(schedules.one_f_one_b(4, 8))
    return [[(f"{a.kind} {a.stage} {a.micro}", s, e) for a, s, e in r] for r in out]


SAMPLES: dict[str, Callable[[], Figure]] = {
    "cost_plot": lambda: viz.cost_plot(
        [1e3, 1e4, 1e5],
        {"ring": [[1e-4, 2e-4], [2e-4], [1e-3]], "naive": [2e-4, 3e-4, 3e-3]},
        {"ring": [1e-4, 2e-4, 9e-4], "naive": [2e-4, 4e-4, 2e-3]},
        "4 ranks",
    ),
    "timeline": lambda: viz.timeline(
        [
            ("forward", 0.0, 0.001),
            ("backward", 0.001, 0.003),
            ("all_reduce 0", 0.002, 0.0035),
            ("all_reduce 1", 0.003, 0.004),
            ("wait", 0.003, 0.004),
        ],
        "rank 0, one step",
    ),
    "hidden_sweep": lambda: viz.hidden_sweep(
        [0.25, 1, 4, 25], [[0.2, 0.5], [0.4, 0.6], [0.5, 0.7], [0.0, 0.1]], "sweep"
    ),
    "gantt": lambda: viz.gantt(_gantt(), "1F1B, 4 ranks, 8 micro-batches"),
    "mesh_groups": lambda: viz.mesh_groups((2, 2, 2), ("dp", "pp", "tp")),
    "axis_bytes": lambda: viz.axis_bytes(
        {k: {"dp": 2048, "tp": 1024, "pp": 256} for k in ("2x2x2", "4x1x2", "8x1x1")},
        {k: {"dp": 2048, "tp": 1024, "pp": 256} for k in ("2x2x2", "4x1x2", "8x1x1")},
    ),
    "layout_costs": lambda: viz.layout_costs(_layouts(), "layouts of 8 ranks"),
    "loss_curves": lambda: viz.loss_curves(
        {"fp32": [3.0, 2.0, 1.0], "bf16": [3.0, 2.1, 1.1]}, "TinyGPT"
    ),
    "memory_timeline": lambda: viz.memory_timeline(
        {"parameters": [4, 4, 4, 4], "activations": [0, 3, 5, 1], "loss": [0, 0, 2, 0]},
        {"forward": 0, "backward": 2, "step": 3},
        {"loss": 11},
        "bytes",
        1,
        "one step",
    ),
    "memory_stacks": lambda: viz.memory_stacks(
        {
            n: {"parameters": 2, "gradients": 2, "optimizer": 8, "activations": 5}
            for n in ("DP", "ZeRO-1", "ZeRO-2", "FSDP", "FSDP + TP")
        },
        "GiB",
        limit=12,
        title="fastest layouts",
    ),
    "who_holds": lambda: viz.who_holds(4),
    "memory_for_communication": lambda: viz.memory_for_communication(
        ["DP", "ZeRO-1", "ZeRO-2", "FSDP"], [16, 10, 7, 4], [8, 8, 8, 12], "rank 0"
    ),
    "bytes_against_ranks": lambda: viz.bytes_against_ranks(
        [1, 2, 4, 8],
        {"DP": [16] * 4, "ZeRO-3": [16, 8, 4, 2]},
        {"DP": [16] * 4, "ZeRO-3": [16, 8, 4, 2]},
        "rank 0",
    ),
    "dispatch_matrix": lambda: viz.dispatch_matrix(
        [[3, 1, 0, 2], [1, 2, 2, 1], [0, 4, 1, 1], [2, 0, 3, 1]],
        [[0, 1], [2, 3], [4, 5], [6, 7]],
        "8 experts on 4 ranks",
    ),
    "expert_load": lambda: viz.expert_load(
        [5, 1, 2, 4, 3, 0, 2, 7], [3, 1, 2, 3, 3, 0, 2, 3], capacity=3, title="top-1"
    ),
    "conversion_bytes": lambda: viz.conversion_bytes(_costs(), "conversions"),
    "rank_tensors": lambda: viz.rank_tensors(
        [torch.arange(4.0) + 4 * r for r in range(4)], [torch.full((4,), 28.0)] * 4
    ),
    "tp_layout": lambda: viz.tp_layout(4, title="Y = X Wᵀ on 4 ranks"),
    "sbp_pieces": lambda: viz.sbp_pieces(
        {
            "S(0)": list(torch.arange(16.0).view(4, 4).chunk(4)),
            "B": [torch.arange(16.0).view(4, 4)] * 4,
        },
        "one tensor, two signatures",
    ),
    "ring_blocks": lambda: viz.ring_blocks(4),
    "cluster": lambda: viz.cluster(4, ["GPU 0", "GPU 1", "GPU 2", "GPU 3"]),
    "ring": lambda: viz.ring(4, ["x 0", "x 1", "x 2", "x 3"], "to the right"),
    "schedule": lambda: viz.schedule(
        schedules.gpipe(4, 8),
        schedules.one_f_one_b(4, 8),
        schedules.interleaved(4, 8, 2),
    ),
    "strategies": lambda: viz.strategies(4),
    "four_moves": lambda: viz.four_moves(2, 2, 2, 4),
    "calls": lambda: viz.calls(
        [
            ["#1 isend float32[2, 4] to rank 1 (32 B), returned"] * 2,
            ["#1 recv float32[2, 4] from rank 0 (32 B), returned"]
            + ["#2 all_reduce float32[] (4 B), entered"],
        ]
    ),
}
WIDE = {"gantt", "mesh_groups", "layout_costs", "who_holds", "dispatch_matrix"}
