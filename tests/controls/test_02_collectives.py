"""Negative controls of chapter 2: its own cells (the ring all-reduce written in the
chapter; the package's collectives against torch's on whole numbers, where every
sum is exact; the bytes a Ledger counts against `costmodel.sent_per_rank`), run
with a fault planted, must turn each verdict they print from PASS to FAIL.

The faults: the chapter's ring with a chunk off by one; the package's all-reduces
leaving the last rank out, its broadcast from the wrong root, its all-gather's
blocks and its reduce-scatter's input one slot off; the ledger's cell with the
agreement check left on, and a formula that counts what a rank hands in. One spawn
of the chapter's 4 ranks runs them (tests/controls/harness.py); the lines as
written are the stored notebook's.

The alpha-beta verdicts are judged on a run stored in
book/measurements/ch02_alpha_beta.json (`bench.alphabeta.verdicts`); their controls
plant times shaped like the chapter's: a model with no beta term fails the held-out
sizes, and 4-rank times that follow the 2-rank model (ranks that each had a core)
fail the break lines.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import harness
import pytest
import torch
import torch.distributed as dist
from harness import Fault, Plant, Swap

from distcourse import comm
from distcourse.bench import alphabeta
from distcourse.comm import costmodel

CHAPTER = harness.Chapter(
    "02_collectives",
    prelude="from distcourse import comm\n",
    here="from IPython.display import display\nfrom distcourse import tables\n",
    stored=True,
)
RING = [
    "token = torch.zeros(1",
    "def shift(outgoing",
    "def start():",
    "mid = x.clone()",
]
OURS = ["def check(name, ours, collective", 'check("tree_broadcast"']
LEDGER = ["S = 2**20  # 1 MiB", "every rank sent exactly what its formula says"]


def last_rank_left_out(real: Callable) -> Callable:
    """An all-reduce run on a group of ranks 0..N-2: the last rank keeps its own."""

    def faulty(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        n = dist.get_world_size()
        fewer = dist.new_group(list(range(n - 1)))  # every rank takes part
        if dist.get_rank() == n - 1:
            return x
        return real(x, *args, **{**kwargs, "group": fewer})

    return faulty


def from_rank_1(real: Callable) -> Callable:
    """A broadcast from rank 1, whatever root it is asked for."""
    return lambda x, *args, **kwargs: real(x, *args, **{**kwargs, "src": 1})


def one_slot_off(real: Callable) -> Callable:
    """An all-gather whose blocks land one slot off: each rank's where its right
    neighbour's belongs."""
    return lambda out, x, *a, **kw: real(out, x, *a, **kw).roll(x.numel())


def rolled_in(real: Callable) -> Callable:
    """A reduce-scatter handed its input rolled by one block: each rank left with
    its neighbour's block."""

    def faulty(out: torch.Tensor, x: torch.Tensor, *a: Any, **kw: Any) -> Any:
        return real(out, x.roll(-(x.numel() // dist.get_world_size())), *a, **kw)

    return faulty


def handed_in(name: str, nbytes: int, n: int) -> list[int]:
    """A formula that counts what each rank hands in (S bytes), not what it sends."""
    return [nbytes] * n


LEDGER_CALL = "        all_reduce(torch.ones(S // 4, device=device), check={})"
FAULTS = {
    "chunk off by one": Fault(
        RING,
        Swap(
            "        chunks[theirs].add_(incoming)",
            "        chunks[mine].add_(incoming)",
        ),
    ),
    "one rank off": Fault(
        OURS,
        *(
            Plant(comm, f"{name}_all_reduce", last_rank_left_out, wrap=True)
            for name in ("ring", "naive", "tree")
        ),
        Plant(comm, "tree_broadcast", from_rank_1, wrap=True),
        Plant(comm, "ring_all_gather", one_slot_off, wrap=True),
        Plant(comm, "ring_reduce_scatter", rolled_in, wrap=True),
    ),
    "check left on": Fault(
        LEDGER, Swap(LEDGER_CALL.format("False"), LEDGER_CALL.format("True"))
    ),
    "formula of what is handed in": Fault(
        LEDGER, Plant(costmodel, "sent_per_rank", handed_in)
    ),
}


CONTROLS = harness.Controls(
    "02_collectives",
    test_a_ring_with_a_chunk_off_by_one_is_not_torchs=harness.Flip(
        ["chunk off by one"],
        r"equal to dist\.all_reduce: True",
        "the cell's ring with a chunk off by one: each incoming chunk added into the "
        "chunk just sent",
    ),
    test_collectives_one_rank_off_are_not_torchs=harness.Flip(
        ["one rank off"],
        r"(ring|naive|tree)_all_reduce (SUM|MAX)\s+equals torch's: True",
        "the last rank left out of the all-reduce (run on a group of ranks 0-2)",
        r"tree_broadcast\s+equals torch's: True",
        "broadcast from rank 1, one off the root torch's broadcast uses",
        r"ring_all_gather\s+equals torch's: True",
        "the gathered blocks one slot off: each rank's where its neighbour's belongs",
        r"ring_reduce_scatter\s+equals torch's: True",
        "input rolled by one block: each rank left with its neighbour's block",
    ),
    test_bytes_counted_with_the_check_fail=harness.Flip(
        ["check left on"],
        r"every rank sent exactly what its formula says: PASS",
        "the bytes counted with the 112-byte agreement check left on (check=True)",
    ),
    test_a_formula_of_the_bytes_handed_in_fails=harness.Flip(
        ["formula of what is handed in"],
        r"every rank sent exactly what its formula says: PASS",
        "a formula that counts what a rank hands in (S bytes each), not what it sends",
    ),
)
globals().update(CONTROLS.tests())


SIZES = list(alphabeta.Config().sizes)
ALPHA, BETA = 150e-6, 1e-9  # a Python step's alpha, loopback's bandwidth
SPREAD = (0.6, 0.8, 1.0, 1.2, 1.4)  # five repeats, what a shared machine adds


def _times(world: int) -> dict[str, list[list[float]]]:
    """Five repeats per size, spread +-40 % around the model's time on `world`."""
    return {
        name: [
            [
                k
                * costmodel.predict(f"{name}_all_reduce", s, world, ALPHA, BETA).seconds
                for k in SPREAD
            ]
            for s in SIZES
        ]
        for name in alphabeta.ALGORITHMS
    }


def beta_free(real: Callable) -> Callable:
    """The held-out fit with no beta term: time that does not grow with the bytes."""
    return functools.partial(real, beta=False)


FOLLOWING = {"sizes": SIZES, "times": {"2": _times(2), "4": _times(4)}}


@pytest.mark.controls(
    "02_collectives",
    r"2 ranks, (naive|ring |tree ) α = .*; held-out sizes",
    fault="a model with no beta term (time that does not grow with the bytes)",
    printed_on="a stored quiet run (book/measurements/ch02_alpha_beta.json)",
)
def test_a_beta_free_model_fails_the_held_out_sizes(stored_flips: Callable) -> None:
    plant = Plant(alphabeta, "held_out", beta_free, wrap=True)
    stored_flips(alphabeta.verdicts, alphabeta.NAME, FOLLOWING, plant)


@pytest.mark.controls(
    "02_collectives",
    r"4 ranks on 2 cores, (naive|tree |ring ) at .* outside a factor 3",
    fault="4-rank times that follow the 2-rank model (ranks that each had a core); "
    "a run stored under load",
    printed_on="a stored quiet run (book/measurements/ch02_alpha_beta.json)",
)
def test_four_ranks_that_follow_the_model_fail_the_break_verdicts(
    stored_flips: Callable,
) -> None:
    lines = stored_flips(alphabeta.verdicts, alphabeta.NAME, FOLLOWING)
    assert len([ln for ln in lines if ln.startswith("4 ranks")]) == len(
        alphabeta.BREAKS
    )
