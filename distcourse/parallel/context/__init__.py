"""Context parallelism: attention over a sequence split across the ranks of a group.

- `split`: which tokens each rank holds ("zigzag": chunks r and 2·cp − 1 − r;
  "contiguous"), their global positions, shard and unshard;
- `ring`: ring_attention (keys and values passed round the ring, online softmax;
  a backward that passes their gradients home), Work (blocks computed);
- `cost`: wire bytes (ring_bytes), memory kept for backward (saved_bytes against
  saved_bytes_formula; one process's fused attention, on the CPU and on CUDA:
  full_attention_formula) and work per rank (work_blocks, imbalance) by formula;
- `check`: the chapter's checks against one process's attention
  (against_full_attention) and of bytes, memory and blocks (wire_and_memory);
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
    "unshard",
    "work_blocks",
]
