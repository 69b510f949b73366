"""Negative controls of chapter 6: its own cells, run with a fault planted in the
global-tensor package, must turn each verdict they print from PASS to FAIL.

The faults: `to_global` that never broadcasts a broadcast tensor from coordinate 0
(each rank keeps its own copy; the cells are given copies that differ by rank, which
the broadcast would have made equal), boxing that sums a partial tensor twice,
conversions by another route than their collective (their bytes miss the formula),
`load` that never broadcasts what rank 0 read, and split parameters' gradients
summed over the ranks as broadcast ones are. One spawn of the chapter's 4 ranks runs
them all (tests/controls/harness.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import harness
import torch.distributed as dist
from boxing_faults import NoBroadcast, roundabout, sums_twice
from harness import Fault, Plant, Swap

import distcourse.global_tensor as gt
from distcourse.global_tensor import boxing, create, io

CHAPTER = harness.Chapter(
    "06_global_tensor", setup=["p1 = gt.placement", "class ToyModel"], stored=True
)
S0, S1, B, P = gt.sbp.split(0), gt.sbp.split(1), gt.sbp.broadcast, gt.sbp.partial_sum
PIECES = [  # the cells, by a text of each
    "held = {}  # what I hold under each signature",
    "x2 = gt.to_global(whole, p2, (B, B))",
]
DTENSOR = "mesh = init_device_mesh(device.type, (4,))  # the placement p1"
DIFFERENT_COPIES = [  # each rank's copy made different: to_global must even them
    Swap(
        "x = gt.to_global(whole, p1, B)  # the same logical tensor on every rank",
        "x = gt.to_global(whole + rank, p1, B)",
    ),
    Swap(
        "x2 = gt.to_global(whole, p2, (B, B))",
        "x2 = gt.to_global(whole + rank, p2, (B, B))",
    ),
    Swap(
        "ga, gb = gt.to_global(a, p1, B), gt.to_global(b, p1, B)",
        "ga, gb = gt.to_global(a + rank, p1, B), gt.to_global(b + rank, p1, B)",
    ),
    Swap(
        "ours = gt.to_global(whole, p1, B)", "ours = gt.to_global(whole + rank, p1, B)"
    ),
]


def summed_like_broadcast(watch: Callable) -> Callable:
    """Every parameter's gradient all-reduced over its placement, as a broadcast
    parameter's is: a split one's rows then mix the ranks' different rows."""

    def watch_grad(t: gt.GlobalTensor) -> None:
        watch(t)

        def hook(g: Any) -> Any:
            local = g.to_local().clone()
            dist.all_reduce(local, group=t.placement.flat)
            return gt.GlobalTensor(local, g.placement, g.sbp, tuple(g.shape))

        t.register_hook(hook)

    return watch_grad


FAULTS = {
    "copies kept": Fault(
        [*PIECES, "for sa, sb in ((S0, B)", DTENSOR],
        *DIFFERENT_COPIES,
        Plant(create, "dist", NoBroadcast()),
    ),
    "sums twice": Fault(
        [
            *PIECES,
            "dp = gt.to_global(ToyModel()",
            "for sa, sb in ((S0, B)",
            DTENSOR,
            "part = torch.arange(64.0",
            "ours = gt.to_global(copy.deepcopy(plain)",
            "gradients: ours vs DTensor",
        ],
        Plant(boxing, "convert", sums_twice, wrap=True),
    ),
    "another route": Fault(
        ["for src, dst in ((S0, B), (P, S0)"],
        Plant(boxing, "convert", roundabout, True),
    ),
    "load never broadcasts": Fault(
        ["dp = gt.to_global(ToyModel()", "gt.save(dp.state_dict()"],
        Plant(io, "dist", NoBroadcast()),
    ),
    "split gradients summed": Fault(
        ["class ModelParallelLinear", "mp = ModelParallelLinear("],
        Plant(create, "watch_grad", summed_like_broadcast, wrap=True),
    ),
}


CONTROLS = harness.Controls(
    "06_global_tensor",
    test_full_tensor_fails_with_copies_kept_or_a_partial_summed_twice=harness.Flip(
        ["copies kept", "sums twice"],
        r"full_tensor\(\) == whole: True",
        "to_global keeps each rank's copy of a broadcast tensor (copies that differ "
        "by rank, never broadcast from coordinate 0); boxing sums a partial tensor "
        "twice",
    ),
    test_a_conversion_by_another_route_misses_the_formula=harness.Flip(
        ["another route"],
        r"ledger +\d+ B, formula +\d+ B PASS",
        "each conversion done by another route (P -> S as all_reduce + slice, ...)",
    ),
    test_a_partial_summed_twice_fails=harness.Flip(
        ["sums twice"],
        r"losses vs one process|parameters vs one process",
        "boxing sums a partial tensor twice: data parallelism's gradients x 2",
        r"same pieces <= 1e-05: PASS",
        "boxing sums a partial tensor twice",
        r"gradients: ours vs DTensor",
        "boxing sums a partial tensor twice: our gradients x 2",
    ),
    test_a_load_that_never_broadcasts_fails=harness.Flip(
        ["load never broadcasts"],
        r"loaded model == saved model",
        "gt.load never broadcasts the tensors rank 0 read",
    ),
    test_model_parallel_gradients_summed_fail=harness.Flip(
        ["split gradients summed"],
        r"losses [\d.]+ -> [\d.]+; vs one process",
        "split parameters' gradients all-reduced over the ranks, as broadcast ones are",
    ),
    test_matmul_rules_fail_with_copies_kept_or_a_partial_summed_twice=harness.Flip(
        ["copies kept", "sums twice"],
        r"-> \S+: vs one process <= 1e-05: PASS",
        "to_global keeps each rank's copy of A and B (copies that differ by rank); "
        "boxing sums a partial tensor twice (the rules with P)",
    ),
    test_copies_kept_differ_from_dtensors_pieces=harness.Flip(
        ["copies kept"],
        r"ours \(\d+, \d+\), DTensor \(\d+, \d+\), same: True",
        "to_global keeps each rank's copy (copies that differ by rank)",
    ),
)
globals().update(CONTROLS.tests())
