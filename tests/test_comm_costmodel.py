"""distcourse.costmodel: the alpha-beta formulas, the fit, and timing on live ranks."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.distributed as dist

from distcourse import comm
from distcourse.comm import costmodel
from distcourse.launch import spawn


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_predict_follows_the_textbook_formulas(n: int) -> None:
    s, a, b = 1e6, 1e-5, 1e-9
    ring = costmodel.predict("ring_all_reduce", s, n, a, b)
    assert ring.steps == 2 * (n - 1)
    assert ring.bytes_sent == pytest.approx(2 * (n - 1) / n * s)
    assert ring.seconds == pytest.approx(2 * (n - 1) * (a + b * s / n))
    naive = costmodel.predict("naive_all_reduce", s, n, a, b)
    assert naive.bytes_sent == pytest.approx((n - 1) * s)
    assert naive.seconds >= ring.seconds  # the ring never loses under this model
    for name in ("ring_all_gather", "ring_reduce_scatter"):
        cost = costmodel.predict(name, s, n, a, b)
        assert (cost.steps, cost.bytes_sent) == (n - 1, pytest.approx((n - 1) / n * s))
    tree = costmodel.predict("tree_broadcast", s, n, a, b)
    assert tree.steps == (math.ceil(math.log2(n)) if n > 1 else 0)
    assert tree.seconds == pytest.approx(tree.steps * (a + b * s))


def test_predict_rejects_unknown_collectives_and_world_sizes() -> None:
    with pytest.raises(ValueError, match="unknown collective 'allreduce'"):
        costmodel.predict("allreduce", 1, 2)
    with pytest.raises(ValueError, match="world_size must be a positive integer"):
        costmodel.predict("ring_all_reduce", 1, 0)


def test_bus_bandwidth_scales_by_the_ring_factor() -> None:
    assert costmodel.bus_bandwidth(1e9, 4, 1.0) == pytest.approx(1.5e9)
    assert costmodel.bus_bandwidth(1e9, 4, 2.0, "all_gather") == pytest.approx(3.75e8)


@pytest.mark.parametrize("relative", [True, False])
def test_fit_alpha_beta_recovers_the_parameters(relative: bool) -> None:
    alpha, beta = 30e-6, 1 / 2e9  # 30 us latency, 2 GB/s
    sizes = np.array([4.0**k * 1024 for k in range(9)])
    noise = 1 + 0.01 * np.random.default_rng(0).standard_normal(sizes.size)
    times = (alpha + beta * sizes) * noise
    fit_a, fit_b = costmodel.fit_alpha_beta(sizes, times, relative=relative)
    assert fit_b == pytest.approx(beta, rel=0.05)
    if relative:  # only the relative fit sees the small messages that fix alpha
        assert fit_a == pytest.approx(alpha, rel=0.1)
    exact = costmodel.fit_alpha_beta(sizes, alpha + beta * sizes)
    assert exact == (pytest.approx(alpha), pytest.approx(beta))
    with pytest.raises(ValueError, match="at least two"):
        costmodel.fit_alpha_beta([1.0], [1.0])


def _measure() -> dict:
    return costmodel.measure(
        {"torch": dist.all_reduce, "ring": comm.ring_all_reduce}, [64, 4096], repeats=2
    )


@pytest.mark.parametrize(
    "name", ["ring_all_reduce", "naive_all_reduce", "tree_all_reduce"]
)
def test_fit_collective_recovers_alpha_and_beta_of_its_own_model(name: str) -> None:
    alpha, beta, n = 200e-6, 1 / 1e9, 4
    sizes = [4.0**k * 1024 for k in range(6)]
    times = [costmodel.predict(name, s, n, alpha, beta).seconds for s in sizes]
    assert costmodel.fit_collective(name, sizes, times, n) == (
        pytest.approx(alpha),
        pytest.approx(beta),
    )
    noisy = [t * (1.3 if i % 2 else 0.8) for i, t in enumerate(times)]
    fit_a, fit_b = costmodel.fit_collective(name, sizes, noisy, n)
    assert 0.5 * alpha < fit_a < 2 * alpha and 0.5 * beta < fit_b < 2 * beta
    with pytest.raises(ValueError, match="at least two"):
        costmodel.fit_collective(name, [1.0], [1.0], n)


def test_within_factor_is_a_verdict_that_can_fail() -> None:
    assert (
        costmodel.within_factor([1.0, 2.0], [2.5, 1.0], 3) == "within a factor 3: PASS"
    )
    assert costmodel.within_factor([1.0], [4.0], 3) == "off by a factor 4.0 > 3: FAIL"
    assert costmodel.within_factor([-1.0], [1.0], 3).endswith("FAIL")
    with pytest.raises(ValueError, match="factor must be above 1"):
        costmodel.within_factor([1.0], [1.0], 1)


def _spread() -> list:
    return costmodel.measure(dist.all_reduce, [64, 4096], repeats=3, spread=True)


def test_measure_with_spread_keeps_every_repeat_sorted() -> None:
    results = spawn(_spread, 2)
    assert results[0] == results[1]
    for runs in results[0]:
        assert len(runs) == 3 and runs == sorted(runs) and runs[0] > 0


def test_measure_times_each_size_and_agrees_across_ranks() -> None:
    results = spawn(_measure, 2)
    assert results[0] == results[1]  # the maximum over ranks, so every rank agrees
    for times in results[0].values():
        assert len(times) == 2 and all(0 < t < 5 for t in times)


def test_tree_all_reduce_cost_and_bytes_per_rank() -> None:
    s, a, b = 1e6, 1e-5, 1e-9
    for n, rounds in [(1, 0), (2, 1), (3, 2), (4, 2), (5, 3), (8, 3)]:
        tree = costmodel.predict("tree_all_reduce", s, n, a, b)
        assert (tree.steps, tree.bytes_sent) == (2 * rounds, rounds * s)
        assert tree.seconds == pytest.approx(2 * rounds * (a + b * s))
        per_rank = costmodel.sent_per_rank("tree_all_reduce", 8, n)
        assert sum(per_rank) == 2 * (n - 1) * 8 and max(per_rank) == rounds * 8
    assert costmodel.sent_per_rank("naive_all_reduce", 8, 3) == [16, 8, 8]
    assert costmodel.sent_per_rank("ring_all_reduce", 8, 4) == [12] * 4
    with pytest.raises(ValueError, match="not 'ring_all_gather'"):
        costmodel.sent_per_rank("ring_all_gather", 8, 4)


def _ledger_counts(nbytes: int) -> dict[str, int]:
    x = torch.ones(nbytes // 4)
    sent = {}
    for name in ("ring_all_reduce", "naive_all_reduce"):
        with comm.Ledger() as ledger:
            getattr(comm, name)(x.clone(), check=False)
        sent[name] = ledger.bytes_sent()
    return sent


@pytest.mark.parametrize("n", [2, 3, 4])
def test_ledger_on_the_real_sends_equals_sent_per_rank(n: int) -> None:
    nbytes = 4 * 12 * 1000  # a multiple of every N here: equal ring chunks
    counted = spawn(_ledger_counts, n, nbytes)
    for name in ("ring_all_reduce", "naive_all_reduce"):
        want = costmodel.sent_per_rank(name, nbytes, n)
        assert [c[name] for c in counted] == want, name


def test_held_out_fits_one_part_and_judges_the_other() -> None:
    sizes = [4 * 1024 * 4**k for k in range(7)]
    times = [
        costmodel.predict("ring_all_reduce", s, 2, 1e-4, 1e-9).seconds for s in sizes
    ]
    a, b, verdict = costmodel.held_out(
        "ring_all_reduce", sizes, times, 2, [0, 2, 6], [1, 3]
    )
    assert a == pytest.approx(1e-4) and b == pytest.approx(1e-9)
    assert verdict == "within a factor 3: PASS"
    a0, b0, no_beta = costmodel.held_out(
        "ring_all_reduce", sizes, times, 2, [0, 2, 6], [1, 3, 4, 5], beta=False
    )
    assert b0 == 0.0 and a0 > 0 and no_beta.endswith(": FAIL")
    with pytest.raises(ValueError, match="overlap"):
        costmodel.held_out("ring_all_reduce", sizes, times, 2, [0, 2], [2, 3])
