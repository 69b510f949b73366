"""Context parallelism: attention over a sequence split across the ranks of a group.

- `split`: which tokens each rank holds ("zigzag": chunks r and 2·cp − 1 − r;
  "contiguous"), their global positions, shard and unshard;
- `ring`: ring_attention (keys and values passed round the ring, online softmax;
  a backward that passes their gradients home), Work (blocks computed);
- `ulysses`: ulysses_attention (an all_to_all from a sequence split to a head
  split, SDPA on the whole sequence of this rank's heads, an all_to_all back);
- `cost`: wire bytes (ring_bytes, ulysses_bytes), memory kept for backward
  (saved_bytes against saved_bytes_formula; one process's fused attention, on the
  CPU and on CUDA: full_attention_formula) and work per rank (work_blocks,
  imbalance) by formula;
- `check`: the chapter's checks against one process's attention
  (against_full_attention) and of bytes, memory and blocks (wire_and_memory,
  ulysses_cost), and the timings of ring, Ulysses and one process (timings);
- `torch_side`: torch's `context_parallel` (its split runs on CPU, its attention
  needs CUDA kernels);
- `gpt`: TinyGPT with ring attention (context_parallel_gpt), trained dp x cp on a
  2-D mesh against one process (train_dp_cp, against_one_process), the wire bytes
  of its step (step_bytes).
"""

from distcourse.parallel.context.cost import (
    full_attention_formula,
    imbalance,
    ring_bytes,
    saved_bytes,
    saved_bytes_formula,
    ulysses_bytes,
    work_blocks,
)
from distcourse.parallel.context.ring import Work, block_mask, ring_attention
from distcourse.parallel.context.split import (
    LAYOUTS,
    check_sequence,
    chunk_ids,
    positions,
    shard,
    unshard,
)
from distcourse.parallel.context.ulysses import ulysses_attention

__all__ = [
    "LAYOUTS",
    "Work",
    "block_mask",
    "check_sequence",
    "chunk_ids",
    "full_attention_formula",
    "imbalance",
    "positions",
    "ring_attention",
    "ring_bytes",
    "saved_bytes",
    "saved_bytes_formula",
    "shard",
    "ulysses_attention",
    "ulysses_bytes",
    "unshard",
    "work_blocks",
]
