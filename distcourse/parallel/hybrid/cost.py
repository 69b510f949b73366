"""What a layout costs, by formula: bytes each axis sends per step, parameters held.

Bytes follow the book's one convention (chapter 2): what crosses the wire per rank
for the algorithm that runs; an all-reduce of T bytes over a ring of n ranks sends
2 (n - 1) / n x T per rank, a point-to-point message its own size.

float32 throughout (4 bytes). For a whole batch of B sequences of T tokens, width C,
vocabulary V, L blocks, on a rank of pipeline stage s (of pp) in a layout
dp x pp x tp, with b = B / dp sequences in its share and A = 4 b T C the bytes of
one activation of the share (summed over micro-batches):

    tp: every block all-reduces one activation in forward (g, after attention and
        after the MLP) and one in backward (f, before each): 4 A per block; stage 0
        adds the vocabulary-parallel embedding's forward all-reduce (A), the last
        stage the head's f (A) and the loss's max and (sum, target) all-reduces
        (3 x 4 b T); all of it times 2 (tp - 1) / tp on the wire;
    pp: stage s sends its activations forward unless it is last (A) and its input
        gradients back unless it is first (A);
    dp: the all-reduce of every gradient this rank holds: 4 x its parameters,
        times 2 (dp - 1) / dp on the wire.
"""

from __future__ import annotations

from distcourse.comm.ledger import ring_wire_bytes
from distcourse.examples.gpt import GPTConfig
from distcourse.parallel.hybrid.layout import Layout

FLOAT = 4  # bytes


def ring_all_reduce(nbytes: int, n: int) -> int:
    """Bytes one rank puts on the wire for an all-reduce of `nbytes` over a ring of
    `n` ranks: 2 (n - 1) / n of them (reduce-scatter, then all-gather), as the
    ledger counts it."""
    return ring_wire_bytes("all_reduce", nbytes, n)


def parameters_held(layout: Layout, cfg: GPTConfig, stage: int) -> int:
    """Parameters on a rank of pipeline stage `stage`: its blocks' (and embeddings' or
    head's) split weights / tp, plus the replicated norms, positions, row biases."""
    C, V, tp = cfg.n_embd, cfg.vocab, layout.tp
    norms = 2 * (2 * C)  # ln1, ln2: whole on every rank
    attention = 4 * (C * C) // tp + 3 * C // tp + C  # q, k, v, proj; proj's bias whole
    mlp = (4 * C * C + 4 * C) // tp + (4 * C * C) // tp + C  # fc (column), proj (row)
    per_block = norms + attention + mlp
    held = cfg.n_layer // layout.pp * per_block
    if stage == 0:
        held += V * C // tp + cfg.block_size * C  # tokens split, positions whole
    if stage == layout.pp - 1:
        held += 2 * C + V * C // tp  # ln_f, head (no bias)
    return held


def bytes_per_step(
    layout: Layout, cfg: GPTConfig, batch: int, stage: int, act_bytes: int = FLOAT
) -> dict[str, int]:
    """Wire bytes a rank of pipeline stage `stage` sends per step along each axis:
    activations of `act_bytes` an element (float32 as the package trains; 2 in
    mixed precision), gradients in float32."""
    b, T, C = batch // layout.dp, cfg.block_size, cfg.n_embd
    A = act_bytes * b * T * C
    first, last = stage == 0, stage == layout.pp - 1
    blocks = cfg.n_layer // layout.pp
    # each tp all-reduce is a separate call: the ring share of each, summed
    tp = (4 * blocks + first + last) * ring_all_reduce(A, layout.tp)
    tp += 3 * last * ring_all_reduce(act_bytes * b * T, layout.tp)
    pp = A * ((not last) + (not first)) if layout.pp > 1 else 0
    dp = ring_all_reduce(FLOAT * parameters_held(layout, cfg, stage), layout.dp)
    return dict(dp=dp, pp=pp, tp=tp)


def memory_per_rank(layout: Layout, cfg: GPTConfig, stage: int) -> int:
    """Bytes of model state on a rank: parameters, gradients, AdamW's two moments
    (4 + 4 + 8 = 16 bytes per parameter held). Activations are measured apart."""
    return 4 * FLOAT * parameters_held(layout, cfg, stage)
