"""FSDP (ZeRO stage 3) from scratch: parameters, gradients and optimizer state sharded.

Read `api.py` first (`fully_shard`, `full_state_dict`: FSDP2's calls), then `unit.py`
(what one unit does around forward and backward), `layout.py` (torch.chunk's
dim-0 pieces, padded), `checkpoint.py` (sharded state dicts for
torch.distributed.checkpoint: save on N ranks, load on any other number) and
`saved.py` (what autograd keeps for backward: activations apart from the gathered
full weights, measured with saved-tensor hooks, and the formula), `policy.py` (the
arguments as torch 2.14 means them: mixed precision, resharding, HSDP's 2-D mesh)
and `grads.py` (`clip_grad_norm_` over sharded gradients).
"""

from distcourse.parallel.fsdp.api import (
    full_state_dict,
    fully_shard,
    gather_seconds,
    hidden_fraction,
    load_full_state_dict,
    local_pieces,
    set_modules_to_backward_prefetch,
    set_modules_to_forward_prefetch,
    set_requires_gradient_sync,
    step_bytes,
    units,
    world_mesh,
)
from distcourse.parallel.fsdp.checkpoint import (
    load_model_state,
    load_optimizer_state,
    model_state,
    optimizer_state,
)
from distcourse.parallel.fsdp.grads import clip_grad_norm_, gradient_gap
from distcourse.parallel.fsdp.layout import Piece, pieces
from distcourse.parallel.fsdp.policy import MixedPrecisionPolicy
from distcourse.parallel.fsdp.saved import saved_bytes, saved_formula, unit_buffer_bytes
from distcourse.parallel.fsdp.unit import Unit

__all__ = [
    "MixedPrecisionPolicy",
    "Piece",
    "Unit",
    "clip_grad_norm_",
    "full_state_dict",
    "fully_shard",
    "gather_seconds",
    "gradient_gap",
    "hidden_fraction",
    "load_full_state_dict",
    "load_model_state",
    "load_optimizer_state",
    "local_pieces",
    "model_state",
    "optimizer_state",
    "pieces",
    "saved_bytes",
    "saved_formula",
    "set_modules_to_backward_prefetch",
    "set_modules_to_forward_prefetch",
    "set_requires_gradient_sync",
    "step_bytes",
    "unit_buffer_bytes",
    "units",
    "world_mesh",
]
