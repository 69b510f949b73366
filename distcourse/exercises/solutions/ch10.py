"""Solutions to chapter 10's exercises (`distcourse.exercises.ch10`)."""

from __future__ import annotations

mixed_precision_bytes = 2 + 2 + 12  # fp16 weight, fp16 gradient, fp32 weight + moments

s, b, h, a, layers = 2048, 4, 2048, 16, 24
activation_memory = layers * s * b * h * (34 + 5 * a * s / h)  # about 42.8 GiB
recompute_memory = layers * 2 * s * b * h  # each layer's 16-bit input: 768 MiB

# per rank, Ψ = 13e9, N = 8: stage 0 208 GB, stage 1 71.5 GB, stage 2 48.75 GB,
# stage 3 26 GB; 40 GiB is 42.9 GB
zero_stage_that_fits = 3

step_time = 6 * 1e9 * 2**20 / (8 * 312e12 * 0.4)  # about 6.3 s
