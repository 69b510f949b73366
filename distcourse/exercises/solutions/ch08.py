"""Solutions to chapters 8 and 8b's exercises (`distcourse.exercises.ch08`)."""

from __future__ import annotations

from distcourse.parallel.hybrid.layout import Layout

groups = {"dp": [1, 5], "pp": [5, 7], "tp": [4, 5]}  # (d, p, t) = (1, 0, 1)
layout = Layout(dp=1, pp=2, tp=4)  # 0.33 GiB; (1, 4, 2) fits too

# stage 0 of GPTConfig() (C = 32, V = 64, T = 16) on tp = 4: one of its two blocks
# (norms 128, attention 1080, mlp 2112), the tokens 64*32/4, the positions 16*32
parameters_held = 3320 + 512 + 512

dp_tp_plan = {
    "data": ("S(0)", "B"),
    "fc.weight": ("B", "S(0)"),
    "fc.bias": ("B", "S(0)"),
    "hidden": ("S(0)", "S(1)"),
    "proj.weight": ("B", "S(1)"),
    "proj output before its bias": ("S(0)", "P"),
    "proj.bias": ("B", "B"),
}
