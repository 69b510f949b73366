"""Chapter 2's alpha-beta benchmark: the model holds on 2 ranks (held-out sizes
within the band, on medians) and breaks where 4 ranks miss their prediction by more
than the band; a run stored under load fails every line."""

from __future__ import annotations

import pytest

from distcourse.bench import alphabeta, record
from distcourse.comm.costmodel import predict

SIZES = list(alphabeta.Config().sizes)
ALPHA, BETA = 100e-6, 1 / 2e9


def _times(world: int, off: dict[str, float]) -> dict[str, list[list[float]]]:
    """Three repeats per size around the model's time (x `off[name]`): the median
    is the model's, the fastest and slowest 10 % either side."""
    return {
        name: [
            [f * t * off.get(name, 1.0) for f in (0.9, 1.0, 1.1)]
            for t in (
                predict(f"{name}_all_reduce", s, world, ALPHA, BETA).seconds
                for s in SIZES
            )
        ]
        for name in alphabeta.ALGORITHMS
    }


def _stored(off4: dict[str, float], quiet: bool = True) -> record.Stored:
    data = dict(sizes=SIZES, times={"2": _times(2, {}), "4": _times(4, off4)})
    return record.Stored(alphabeta.NAME, data, {"quiet": quiet})


def test_the_model_fitted_on_two_ranks_is_recovered_and_predicts_four() -> None:
    stored = _stored({})
    for name, (a, b, verdict) in alphabeta.fitted(stored.data).items():
        assert a == pytest.approx(ALPHA, rel=1e-6) and b == pytest.approx(
            BETA, rel=1e-6
        )
        assert verdict.endswith("PASS"), name
    for name, ratios in alphabeta.ratios(stored.data).items():
        assert ratios == pytest.approx([1.0] * len(SIZES)), name


def test_the_break_verdict_needs_four_ranks_outside_the_band() -> None:
    """Planted: naive 4x slower than predicted, tree 5x faster: both break. The
    model's own times on 4 ranks (no break) fail the break lines."""
    lines = alphabeta.verdicts(_stored({"naive": 4.0, "tree": 0.2}))
    assert all(line.endswith("PASS") for line in lines), lines
    assert lines[0] == (
        "2 ranks, ring  α = 100 µs, 1/β = 2.00 GB/s; held-out sizes within a factor "
        "3: PASS"
    )
    assert lines[3] == (
        "4 ranks on 2 cores, naive at 4 KiB: 4.00 × predicted from 2 ranks, outside "
        "a factor 3: PASS"
    )
    holds = alphabeta.verdicts(_stored({}))
    assert [line[-4:] for line in holds] == ["PASS"] * 3 + ["FAIL"] * 2
    busy = alphabeta.verdicts(_stored({"naive": 4.0, "tree": 0.2}, quiet=False))
    assert all(line.endswith("FAIL") for line in busy), busy


def test_the_table_puts_the_live_ratios_beside_the_stored_ones() -> None:
    stored = _stored({"ring": 2.0})
    lines = alphabeta.table(stored.data, _stored({}).data)
    assert lines[0].startswith("4 ranks / predicted") and "(live)" in lines[0]
    assert lines[1].split() == [
        "4",
        "KiB",
        "2.00",
        "1.00",
        "1.00",
        "(live)",
        "1.00",
        "1.00",
        "1.00",
    ]


def test_a_quick_run_times_both_world_sizes() -> None:
    data = alphabeta.measure_all(alphabeta.QUICK)
    assert set(data["times"]) == {"2", "4"}
    for world in ("2", "4"):
        for name in alphabeta.ALGORITHMS:
            runs = data["times"][world][name]
            assert len(runs) == 3 and all(len(r) == 2 and min(r) > 0 for r in runs)
