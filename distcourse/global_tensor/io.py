"""gt.save / gt.load: whole tensors written and read by one rank (OneFlow's
global_dst_rank / global_src_rank).

save: every global tensor in `obj` (a tensor, or a dict / list of them, such as a
state_dict) is made whole with full_tensor() (a collective: every rank calls save),
and rank `global_dst_rank` writes the plain result with torch.save.
load: rank `global_src_rank` reads the file; the structure (shapes and dtypes) goes
to the others with one broadcast_object_list, then each tensor with one broadcast.
Tensors come back broadcast on `placement` (default: every rank); a module's
load_state_dict then copies each into its parameter, keeping the parameter's SBP
(B -> S is a slice: no messages).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.utils._pytree import tree_flatten, tree_unflatten

from distcourse import runtime
from distcourse.global_tensor.placement import Placement
from distcourse.global_tensor.placement import placement as make_placement
from distcourse.global_tensor.sbp import Broadcast
from distcourse.global_tensor.tensor import GlobalTensor


def _check_rank(rank: int, what: str) -> None:
    world = dist.get_world_size()
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world:
        raise ValueError(
            f"{what} must be a rank of this world (0..{world - 1}), got {rank!r}"
        )


def save(obj: Any, path: str | Path, global_dst_rank: int = 0) -> None:
    """Write obj with every global tensor made whole, from one rank."""
    _check_rank(global_dst_rank, "global_dst_rank")
    flat, spec = tree_flatten(obj)
    whole = [
        t.full_tensor().detach() if isinstance(t, GlobalTensor) else t for t in flat
    ]
    if dist.get_rank() == global_dst_rank:
        torch.save(tree_unflatten(whole, spec), path)


def load(
    path: str | Path, global_src_rank: int = 0, placement: Placement | None = None
) -> Any:
    """Read obj on one rank; every tensor in it becomes a broadcast global tensor
    (by default on every rank of the world, on the rank's device)."""
    _check_rank(global_src_rank, "global_src_rank")
    device = runtime.device()  # the world's broadcasts: NCCL takes only GPU tensors
    pl = placement or make_placement(device.type, list(range(dist.get_world_size())))
    me = dist.get_rank()
    box: list[Any] = [None]
    if me == global_src_rank:
        flat, spec = tree_flatten(torch.load(path, weights_only=True))
        meta = [(t.shape, t.dtype) if isinstance(t, Tensor) else t for t in flat]
        box = [(meta, spec)]
    else:
        flat = []
    dist.broadcast_object_list(box, src=global_src_rank)
    meta, spec = box[0]
    out = []
    for i, m in enumerate(meta):
        if not (isinstance(m, tuple) and len(m) == 2 and isinstance(m[1], torch.dtype)):
            out.append(m)
            continue
        if flat:
            t = flat[i].contiguous().to(device)
        else:
            t = torch.empty(m[0], dtype=m[1], device=device)
        dist.broadcast(t, src=global_src_rank)
        sig = tuple(Broadcast() for _ in range(pl.ndim))
        out.append(GlobalTensor(t.to(pl.device), pl, sig, tuple(m[0])))
    return tree_unflatten(out, spec)
