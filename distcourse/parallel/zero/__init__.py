"""ZeRO from scratch: the optimizer state (stage 1) and gradients (stage 2) sharded.

Read `optimizer.py` first (torch's `ZeroRedundancyOptimizer`, drop-in), then
`partition.py` (who owns what), `stage2.py` (`ShardedDDP`) and `memory.py` (bytes by
kind against the formulas). Stage 3 shards the parameters too: `parallel.fsdp`.
"""

from distcourse.parallel.zero.memory import formula, held, step_bytes
from distcourse.parallel.zero.optimizer import ZeroRedundancyOptimizer
from distcourse.parallel.zero.partition import Partition, greedy
from distcourse.parallel.zero.stage2 import ShardedDDP

__all__ = [
    "Partition",
    "ShardedDDP",
    "ZeroRedundancyOptimizer",
    "formula",
    "greedy",
    "held",
    "step_bytes",
]
