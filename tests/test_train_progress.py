"""The loss curve is a PNG drawn without a display; the bar shows nothing off a
terminal, and its last state is one line (`Progress.line`, for notebooks and
logs): loss, tokens per second, MFU where there is a peak, memory beside the plan."""

from __future__ import annotations

from pathlib import Path

from distcourse.launch import spawn
from distcourse.train.progress import Progress, save_curve


def test_curve_is_a_png(tmp_path: Path) -> None:
    path = save_curve([3.0, 2.5, 2.0], tmp_path / "loss.png", "three steps")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _bar() -> tuple[bool, str, str]:
    bar = Progress(0, 4)
    empty = bar.line()
    row = dict(
        loss=1.23456,
        tokens_per_s=1234.5,
        mfu=0.314,
        peak_bytes=[100 * 2**20, 101 * 2**20],
        planned_bytes=[99 * 2**20, None],
    )
    bar.update(row, 2)
    bar.close()
    return bar.bar.disable, empty, bar.line()


def test_bar_is_off_without_a_terminal_and_its_line() -> None:
    found = spawn(_bar, 2, timeout=30)
    line = "step 2/4: loss 1.23, 1,234 tok/s, MFU 0.31, peak 101.0 MiB (plan 99.0 MiB)"
    assert found == [(True, "step 0/4: no step recorded", line)] * 2
