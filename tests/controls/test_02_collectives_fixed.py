"""Negative control for chapter 2's held-out verdict (issue 31 item 1).

The chapter fits each all-reduce's alpha and beta on two ranks at 4 KiB, 64 KiB and
16 MiB and prints `held-out sizes within a factor 3: PASS` for 16 KiB to 4 MiB.
Before, the held-out sizes stopped where the bytes barely mattered, and a model
without beta passed too. Here the same check (`costmodel.held_out`) runs on times
shaped like the chapter's (a Python step's alpha, loopback's bandwidth, a spread
of +-40 %): the alpha-beta model passes, the beta-free model FAILs. (Every formula
here is linear in the bytes, so the check tells alpha + beta * S from a constant,
not one collective's constants from another's: the ledger's bytes check that.)
"""

from __future__ import annotations

import pytest

from distcourse.comm.costmodel import held_out, predict

SIZES = [4 * 1024 * 4**k for k in range(7)]  # 4 KiB .. 16 MiB, as in the chapter
FIT_AT, CHECK_AT = [0, 2, 6], [1, 3, 4, 5]
NOISE = [1.4, 0.7, 1.3, 0.6, 1.4, 0.7, 1.2]  # what a shared machine adds and takes


def _times(name: str) -> list[float]:
    """Times of `name` on 2 ranks: alpha 150 us a step, 1 GB/s, with spread."""
    return [
        predict(name, s, 2, 150e-6, 1e-9).seconds * k
        for s, k in zip(SIZES, NOISE, strict=True)
    ]


@pytest.mark.controls(
    "02_collectives",
    r"2 ranks, (naive|ring |tree ).*held-out sizes within a factor 3",
    fault="a model with no beta term (time that does not grow with the bytes)",
    printed_on="a stored quiet run (book/measurements/ch02_alpha_beta.json)",
)
@pytest.mark.parametrize("name", ["ring", "naive", "tree"])
def test_a_beta_free_model_fails_the_held_out_sizes(name: str) -> None:
    coll = f"{name}_all_reduce"
    times = _times(coll)
    *_, right = held_out(coll, SIZES, times, 2, FIT_AT, CHECK_AT)
    assert right.endswith("within a factor 3: PASS")
    *_, no_beta = held_out(coll, SIZES, times, 2, FIT_AT, CHECK_AT, beta=False)
    assert no_beta.endswith(": FAIL"), no_beta
