"""Global tensors: one logical tensor placed and split across ranks (chapter 6).

OneFlow's model and names: a tensor has a `placement` (which ranks, a 1-D or 2-D
array) and an SBP signature (per mesh dimension split(i), broadcast or
partial_sum). Changing the signature is boxing, a collective; every op infers its
output signature from its inputs' (rules, reductions). GlobalTensor is a wrapper
tensor subclass, so nn modules, autograd and torch.optim run on it unchanged.
`layouts` turns a plain model into global parameters by a plan, one signature per
tensor (the DP x TP hybrid of chapter 8b); `stages` puts each stage of a model on
its own placement (2-D + pipeline).

    import distcourse.global_tensor as gt
    p = gt.placement("cpu", ranks=[0, 1])
    x = gt.randn(20, 10, placement=p, sbp=gt.sbp.split(0))
    y = x.to_global(sbp=gt.sbp.broadcast)
"""

# importing rules, reductions and move registers them
from distcourse.global_tensor import (
    duality,
    layouts,
    move,
    reductions,
    rules,
    sbp,
    stages,
)
from distcourse.global_tensor.create import full, ones, randn, to_global, zeros
from distcourse.global_tensor.debug import DebugLog, debug
from distcourse.global_tensor.io import load, save
from distcourse.global_tensor.layouts import parallelize
from distcourse.global_tensor.placement import Placement, placement
from distcourse.global_tensor.stages import Stages
from distcourse.global_tensor.tensor import GlobalTensor

__all__ = [
    "DebugLog",
    "GlobalTensor",
    "Placement",
    "Stages",
    "debug",
    "duality",
    "full",
    "layouts",
    "load",
    "move",
    "ones",
    "parallelize",
    "placement",
    "randn",
    "reductions",
    "rules",
    "save",
    "sbp",
    "stages",
    "to_global",
    "zeros",
]
