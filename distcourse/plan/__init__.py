"""How much memory a layout needs per rank and how long its step takes (chapter 10).

    from distcourse import plan
    model = plan.ModelSpec(layers=32, hidden=4096, heads=32, seq=4096, vocab=32000)
    p = plan.predict(model, 256, plan.DTypePolicy("bf16"),
                     plan.PlanLayout(dp=8, tp=8, micro_batches=1, zero=1),
                     plan.named("h100"))
    p.memory["total"], p.time["total"], p.to_dict()
    plan.search(model, 256, plan.DTypePolicy("bf16"), plan.named("h100"), gpus=64)

spec: the inputs and the checks that refuse impossible layouts; memory: bytes per
rank by kind at each moment of a step; work: FLOPs and bytes moved; timing: seconds
per step by part; hardware: datasheet GPUs and the reader's machine; prediction:
`predict`, `search`, `Prediction`; phases: a step's memory measured phase by phase
(`python -m distcourse.plan.phases` on a GPU). Every formula is in those modules'
docstrings; `python -m distcourse.plan --explain` prints them.
The HTML book's planner ports them to JavaScript; the browser test holds it equal.
"""

from distcourse.plan.checks import check
from distcourse.plan.hardware import (
    GPUS,
    Hardware,
    arch_of,
    copy_rate,
    local,
    matmul_rate,
    named,
)
from distcourse.plan.memory import KINDS, MOMENTS, model_state, rank_memory
from distcourse.plan.prediction import Prediction, candidates, predict, search
from distcourse.plan.spec import DTypePolicy, ModelSpec, PlanLayout

__all__ = [
    "GPUS",
    "KINDS",
    "MOMENTS",
    "DTypePolicy",
    "Hardware",
    "ModelSpec",
    "PlanLayout",
    "Prediction",
    "candidates",
    "check",
    "copy_rate",
    "arch_of",
    "local",
    "matmul_rate",
    "model_state",
    "named",
    "predict",
    "rank_memory",
    "search",
]
