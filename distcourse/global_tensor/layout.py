"""A module's parameters placed one signature each: a layout is a dict of names.

    gt.layout.place(model, p, {"net1.weight": S0, "net1.bias": S0,
                               "net2.weight": S1})   # the rest broadcast

is chapter 4's column- then row-parallel pair as global tensors. Every parameter
takes rank 0's values (as gt.to_global(module, p, B) does) and is then boxed to
its signature; as an nn.Parameter its gradient is boxed into that signature before
it accumulates (a broadcast parameter's P -> B: data parallelism's all_reduce).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from distcourse.global_tensor.create import to_global
from distcourse.global_tensor.placement import Placement
from distcourse.global_tensor.sbp import Broadcast, describe, signature


def place(module: nn.Module, placement: Placement, plan: dict[str, Any]) -> nn.Module:
    """Every parameter of `module` as a global parameter under plan[name] (all
    broadcast if absent), every buffer broadcast; changed in place and returned.
    ValueError, before any collective, for a name that is not a parameter."""
    names = dict(module.named_parameters())
    unknown = sorted(set(plan) - set(names))
    if unknown:
        raise ValueError(f"layout.place: no parameter named {unknown}; the "
                         f"parameters are {sorted(names)}")  # fmt: skip
    b = tuple(Broadcast() for _ in range(placement.ndim))
    sigs = {n: signature(plan.get(n, b), placement.ndim, p.dim(), n)
            for n, p in names.items()}  # fmt: skip
    for sub_name, sub in module.named_modules():
        for name, p in list(sub.named_parameters(recurse=False)):
            full = f"{sub_name}.{name}" if sub_name else name
            with torch.no_grad():
                g = to_global(p.detach(), placement, b).to_global(sbp=sigs[full])
            sub.register_parameter(name, nn.Parameter(g, requires_grad=p.requires_grad))
        for name, buf in list(sub.named_buffers(recurse=False)):
            keep = name not in sub._non_persistent_buffers_set
            sub.register_buffer(name, to_global(buf, placement, b), persistent=keep)
    return module


def signatures(module: nn.Module) -> dict[str, str]:
    """Each global parameter's signature as text, by name."""
    return {n: describe(p.sbp) for n, p in module.named_parameters()
            if hasattr(p, "sbp")}  # fmt: skip
