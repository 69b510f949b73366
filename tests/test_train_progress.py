"""The loss curve is a PNG drawn without a display; the bar shows nothing off a
terminal."""

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
    bar.update(1.0, 10.0, held)
    bar.close()
    return bar.bar.disable, held


def test_bar_is_off_without_a_terminal_and_memory_is_per_rank() -> None:
    found = spawn(_bar, 2, timeout=30)
    assert found == [(True, [100, 101]), (True, [100, 101])]
