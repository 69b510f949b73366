"""ZeRO from scratch: the optimizer state (stage 1) and gradients (stage 2) sharded.

Read `optimizer.py` first (torch's `ZeroRedundancyOptimizer`, drop-in), then
`partition.py` (who owns what), `stage2.py` (`ShardedDDP`) and `memory.py` (bytes by
kind against the formulas). Then ZeRO as the paper and DeepSpeed run it: `flat.py`
(one flat buffer, even pieces per bucket), `flatzero.py` (`FlatZero`: stage 1 and 2
on a reduce-scatter and an all-gather, 2Ψ as DP; stage 2 reduce-scatters bucket by
bucket during backward) and `meter.py` (peak gradient bytes during backward).
Stage 3 shards the parameters too: `parallel.fsdp`.
"""

from distcourse.parallel.zero.flat import FlatLayout, Region
from distcourse.parallel.zero.flatzero import FlatZero, check_flat
from distcourse.parallel.zero.memory import formula, held, step_bytes
from distcourse.parallel.zero.meter import GradientMeter
from distcourse.parallel.zero.optimizer import ZeroRedundancyOptimizer
from distcourse.parallel.zero.partition import Partition, greedy
from distcourse.parallel.zero.stage2 import ShardedDDP

__all__ = [
    "FlatLayout",
    "FlatZero",
    "GradientMeter",
    "Partition",
    "Region",
    "ShardedDDP",
    "ZeroRedundancyOptimizer",
    "check_flat",
    "formula",
    "greedy",
    "held",
    "step_bytes",
]
