"""Solutions to chapter 5's exercises (`distcourse.exercises.ch05`)."""

from __future__ import annotations

bubble = 3 / 11  # (p - 1) / (m + p - 1)


def one_f_one_b(p: int, m: int) -> list[list[str]]:
    """Warm up with p - 1 - r forwards, alternate, then drain the backwards."""
    order = []
    for r in range(p):
        warm = min(p - 1 - r, m)
        acts = [f"F{r}.{j}" for j in range(warm)]
        for i in range(m - warm):
            acts += [f"F{r}.{warm + i}", f"B{r}.{i}"]
        acts += [f"B{r}.{j}" for j in range(m - warm, m)]
        order.append(acts)
    return order


peak_in_flight = 4  # p - r on rank r
interleaved_transfers = 2 * (2 * 4 - 1) * 4  # 2 (p v - 1) m
