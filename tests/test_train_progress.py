"""The loss curve is a PNG drawn without a display; the bar shows nothing off a
terminal, and its last state is one line (`Progress.line`, for notebooks and logs)."""

from __future__ import annotations

from pathlib import Path

from distcourse.launch import spawn
from distcourse.train.progress import Progress, held_per_rank, save_curve


def test_curve_is_a_png(tmp_path: Path) -> None:
    path = save_curve([3.0, 2.5, 2.0], tmp_path / "loss.png", "three steps")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _bar() -> tuple[bool, list[int]]:
    import torch.distributed as dist

    bar = Progress(0, 2)
    held = held_per_rank(100 + dist.get_rank())
    bar.update(1.23456, 1234.5, [h * 2**20 for h in held])
    bar.close()
    return bar.bar.disable, held, bar.line()


def test_bar_is_off_without_a_terminal_and_memory_is_per_rank() -> None:
    found = spawn(_bar, 2, timeout=30)
    line = "step 1/2: loss 1.23, 1,234 tok/s, mem/rank 100.00-101.00 MiB"
    assert found == [(True, [100, 101], line), (True, [100, 101], line)]
