"""Memory per rank: counted bytes equal the formula, for both DDPs, views or not."""

from __future__ import annotations

import torch

from distcourse.bench import memory


def test_held_bytes_counts_a_storage_once() -> None:
    x = torch.zeros(10)
    assert memory.held_bytes([x, x[2:5], x.view(2, 5)]) == 40
    assert memory.held_bytes([x, torch.zeros(5)]) == 60


def test_bytes_held_equal_the_formula_and_views_save_the_gradients() -> None:
    rows = memory.run(width=32)
    assert [(r["impl"], r["view"]) for r in rows] == [
        ("torch", False),
        ("torch", True),
        ("ours", False),
        ("ours", True),
    ]
    for row in rows:
        assert row["held"] == row["expected"], row
    p = rows[0]["parameters"]
    saved = [
        sum(a["held"].values()) - sum(b["held"].values())
        for a, b in (rows[0:2], rows[2:4])
    ]
    assert saved == [4 * p, 4 * p]
    assert "True" in memory.format_table(rows).splitlines()[1]
