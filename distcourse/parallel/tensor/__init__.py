"""Tensor parallelism: single layers split across the ranks of a group.

- `layers`: ColumnParallelLinear, RowParallelLinear (Megatron's f and g at the edges);
- `vocab`: VocabParallelEmbedding, vocab_parallel_cross_entropy (logits never
  gathered);
- `blocks`: ParallelMLP, ParallelSelfAttention, and the sequence-parallel norm and
  positions;
- `compare`: differences (outputs and every gradient against one process),
  gradient_differences (against another split, e.g. torch's DTensor one);
- `model`: parallelize_gpt / parallelize_block (a one-process model's exact twin),
  full state dicts and checkpoints that load on any number of ranks;
- `cost`: wire bytes per sub-layer by formula (sublayer_wire_bytes) and by ledger
  (step_ledger);
- `memory`: a block's activation memory, measured with saved-tensor hooks
  (block_memory, saved_activation_bytes; a whole step's: step_activation_bytes)
  and by formula (block_activation_bytes,
  korthikanti_bytes, and layer_activation_bytes: both as one formula, with
  recompute), each tensor in its dtype policy's bytes (`dtypes.Precision`: fp32,
  bf16, amp-bf16 on a device; the attention kernel's keep from `distcourse.sdpa`).
"""

from distcourse.parallel.tensor.blocks import (
    ParallelMLP,
    ParallelSelfAttention,
    SequenceParallelLayerNorm,
    SequenceParallelPositions,
)
from distcourse.parallel.tensor.compare import (
    differences,
    gradient_differences,
    shard_of,
)
from distcourse.parallel.tensor.cost import step_ledger, sublayer_wire_bytes
from distcourse.parallel.tensor.dtypes import Precision, precision_of
from distcourse.parallel.tensor.layers import ColumnParallelLinear, RowParallelLinear
from distcourse.parallel.tensor.memory import (
    block_activation_bytes,
    block_memory,
    korthikanti_bytes,
    layer_activation_bytes,
    saved_activation_bytes,
    step_activation_bytes,
)
from distcourse.parallel.tensor.model import (
    full_state_dict,
    load_checkpoint,
    load_full_state_dict,
    parallelize_block,
    parallelize_gpt,
    save_checkpoint,
)
from distcourse.parallel.tensor.vocab import (
    VocabParallelEmbedding,
    vocab_parallel_cross_entropy,
)

__all__ = [
    "ColumnParallelLinear",
    "ParallelMLP",
    "ParallelSelfAttention",
    "Precision",
    "RowParallelLinear",
    "SequenceParallelLayerNorm",
    "SequenceParallelPositions",
    "VocabParallelEmbedding",
    "block_activation_bytes",
    "block_memory",
    "differences",
    "full_state_dict",
    "gradient_differences",
    "korthikanti_bytes",
    "layer_activation_bytes",
    "load_checkpoint",
    "load_full_state_dict",
    "parallelize_block",
    "parallelize_gpt",
    "precision_of",
    "save_checkpoint",
    "saved_activation_bytes",
    "shard_of",
    "step_activation_bytes",
    "step_ledger",
    "sublayer_wire_bytes",
    "vocab_parallel_cross_entropy",
]
