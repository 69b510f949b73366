"""Hybrid parallelism: data, pipeline and tensor parallelism on one (dp, pp, tp) mesh.

    layout = Layout(dp=2, pp=2, tp=2)            # 8 ranks, TP innermost
    mesh = make_mesh(layout, cfg)                # checked before any group exists
    net = HybridGPT(TinyGPT(cfg), mesh, micro_batches=2)
    losses = net.train(batches)                  # one process's losses

layout: degrees, every layout of N ranks, the checks; stages: the GPT as a chain
cut into stages and split by TP; runner: HybridGPT (the step); cost: bytes per
axis per step and memory per rank, by formula; check: a layout against one
process (`against_one_process`) and the lines that say so (`verdicts`); fsdp_tp:
FSDP over dp with TP inside on a 2-D mesh (`parallelize_mlp`, `full_state_dict`;
`fsdp_tp.parallelize_gpt` for TinyGPT blocks, `fsdp_tp.train_gpt` against
`fsdp_tp.one_process_gpt`).
"""

from distcourse.parallel.hybrid.check import (
    against_one_process,
    bytes_line,
    verdicts,
)
from distcourse.parallel.hybrid.cost import (
    bytes_per_step,
    memory_per_rank,
    parameters_held,
)
from distcourse.parallel.hybrid.fsdp_tp import full_state_dict, parallelize_mlp
from distcourse.parallel.hybrid.layout import AXES, Layout, check, layouts, make_mesh
from distcourse.parallel.hybrid.runner import HybridGPT
from distcourse.parallel.hybrid.stages import (
    Embed,
    Head,
    as_chain,
    bounds,
    parallelize_stage,
    stages,
)

__all__ = [
    "AXES",
    "Embed",
    "Head",
    "HybridGPT",
    "Layout",
    "against_one_process",
    "as_chain",
    "bounds",
    "bytes_line",
    "bytes_per_step",
    "check",
    "full_state_dict",
    "layouts",
    "make_mesh",
    "memory_per_rank",
    "parallelize_stage",
    "parallelize_mlp",
    "parameters_held",
    "stages",
    "verdicts",
]
