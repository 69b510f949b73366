"""The plan benchmark's pieces without ranks: a measured row is predicted from a
fitted machine, and the report reads as promised (`python -m distcourse.bench plan`
runs the ranks; its factor is stated in the chapter)."""

from __future__ import annotations

from distcourse import plan
from distcourse.bench import plan as bench_plan


def test_prediction_of_a_row_and_the_report() -> None:
    hw = plan.local(1e-4, 1e-9, 1e10, 2**30, 4)
    cfg = bench_plan.QUICK
    row = dict(layout="2x2x1", dp=2, pp=2, tp=1, micro_batches=2, step_ms=10.0)
    seconds = bench_plan.predicted(cfg, row, hw)
    assert seconds > 0
    result = dict(
        factor=2.0,
        hardware=hw.to_dict(),
        table=[dict(layout="2x2x1", measured_ms=10.0, predicted_ms=5.0, ratio=0.5)],
    )
    lines = bench_plan.text(result)
    assert lines[0].startswith("fitted: alpha 100 us, 1.00 GB/s, matmul 10.0 GFLOP/s")
    assert "2x2x1" in lines[1] and lines[-1] == "worst factor, either way: 2.0"
    assert [lay.name for lay in bench_plan.hybrid_bench.chosen(cfg)] == [
        "4x1x1",
        "2x2x1",
        "2x1x2",
        "1x1x4",
    ]
