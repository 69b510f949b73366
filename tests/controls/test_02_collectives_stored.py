"""Negative control for chapter 2's "where it breaks" verdicts (issue 52: judged on
a stored run).

The chapter prints, from book/measurements/ch02_alpha_beta.json, for each algorithm
it says breaks on 4 ranks sharing 2 cores (`bench.alphabeta.BREAKS`): `4 ranks on 2
cores, NAME at SIZE: R × predicted from 2 ranks, outside a factor 3: PASS` (the
median on 4 ranks against the time predicted with the alpha and beta fitted on 2).
Planted: 4-rank times that follow the 2-rank model exactly (ranks that each had a
core, where nothing breaks), with the same spread as the 2-rank ones; and the real
stored run marked as measured under load. Both fail every break line.
"""

from __future__ import annotations

import pytest

from distcourse.bench import alphabeta, record
from distcourse.comm.costmodel import predict

SIZES = list(alphabeta.Config().sizes)
ALPHA, BETA = 150e-6, 1e-9  # a Python step's alpha, loopback's bandwidth


def _times(world: int) -> dict[str, list[list[float]]]:
    """Five repeats per size, spread +-40 % around the model's time on `world`."""
    return {
        name: [
            [
                k * predict(f"{name}_all_reduce", s, world, ALPHA, BETA).seconds
                for k in (0.6, 0.8, 1.0, 1.2, 1.4)
            ]
            for s in SIZES
        ]
        for name in alphabeta.ALGORITHMS
    }


@pytest.mark.controls(
    "02_collectives",
    r"4 ranks on 2 cores, (naive|tree |ring ) at .* outside a factor 3",
    fault="4-rank times that follow the 2-rank model (ranks that each had a core); "
    "a run stored under load",
    printed_on="a stored quiet run (book/measurements/ch02_alpha_beta.json)",
)
def test_four_ranks_that_follow_the_model_fail_the_break_verdicts() -> None:
    data = {"sizes": SIZES, "times": {"2": _times(2), "4": _times(4)}}
    planted = alphabeta.verdicts(record.Stored(alphabeta.NAME, data, {"quiet": True}))
    breaks = [line for line in planted if line.startswith("4 ranks")]
    assert len(breaks) == len(alphabeta.BREAKS)
    assert all(line.endswith(": FAIL") for line in breaks), breaks
    stored = record.load(alphabeta.NAME)
    if stored is not None:  # as written: the run stored with the book passes
        assert all(line.endswith(": PASS") for line in alphabeta.verdicts(stored))
        busy = record.Stored(alphabeta.NAME, stored.data, {"quiet": False})
        assert all(line.endswith(": FAIL") for line in alphabeta.verdicts(busy))
