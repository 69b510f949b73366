"""Expert parallelism: a mixture of experts whose experts live on different ranks.

    moe = MoE(n_embd=32, n_experts=4, top_k=2, capacity_factor=1.25)
    shard_experts(moe, group)      # E / ep experts per rank, checked first
    y = moe(x)                     # counts, dispatch and combine all_to_alls

router: top-k routing with capacity, dropped assignments and the Switch
Transformer's load-balancing loss; dispatch: the all_to_alls with uneven counts;
layer: `MoE`, `shard_experts`; dropless: `DroplessMoE` (no capacity, experts as
one grouped matmul, shared experts, sigmoid routing balanced by a bias), with its
checks in dropless_check; model: TinyGPT with MoE blocks on a (dp, ep) mesh;
cost: bytes per step (ledger convention and exact) and memory per rank; check:
against one process, and the verdict lines.
"""

from distcourse.parallel.experts import cost
from distcourse.parallel.experts.check import (
    TOL,
    layer_against_one_process,
    lines,
    model_against_one_process,
)
from distcourse.parallel.experts.dispatch import Traffic, all_to_all_rows
from distcourse.parallel.experts.dropless import (
    DroplessMoE,
    grouped_mm,
    shard_dropless,
)
from distcourse.parallel.experts.dropless_check import (
    dropless_against_one_process,
    dropless_lines,
)
from distcourse.parallel.experts.layer import MoE, check_experts, shard_experts
from distcourse.parallel.experts.model import (
    MoEConfig,
    as_reference,
    average_gradients,
    moe_gpt,
    moe_layers,
    moe_loss,
    parallelize,
)
from distcourse.parallel.experts.router import Routing, capacity, route

__all__ = [
    "TOL",
    "DroplessMoE",
    "MoE",
    "MoEConfig",
    "Routing",
    "Traffic",
    "all_to_all_rows",
    "as_reference",
    "average_gradients",
    "capacity",
    "check_experts",
    "cost",
    "dropless_against_one_process",
    "dropless_lines",
    "grouped_mm",
    "layer_against_one_process",
    "lines",
    "model_against_one_process",
    "moe_gpt",
    "moe_layers",
    "moe_loss",
    "parallelize",
    "route",
    "shard_dropless",
    "shard_experts",
]
