"""Torch's constructor arguments for our strategies: implemented, accepted, or refused.

A program written for `torch.nn.parallel.DistributedDataParallel` should run with our
`DDP` by changing one import. So `DDP` takes torch's arguments, in torch's order, and
this module decides what each means here. Every argument is one of three kinds:

- implemented: the same effect as torch's (`process_group`, `device_mesh`,
  `bucket_cap_mb`, `find_unused_parameters`, `gradient_as_bucket_view`, `init_sync`,
  `broadcast_buffers`, `forward_sync_buffers`, `device_ids`, `static_graph`);
- accepted, with no effect here, as documented, and none on results in torch either
  (`output_device`, `dim`: only used when one process drove several GPUs;
  `check_reduction`: deprecated; `batched_grad_copy`: a speed option);
- refused with an error saying why, because ignoring it would change what is computed
  (`mixed_precision`, `delay_all_reduce_named_params`, `param_to_hook_all_reduce`,
  `skip_all_reduce_unused_params`, `bucket_cap_mb_list`).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from distcourse.comm.agree import Group

DEFAULT_BUCKET_MB = 25.0  # torch's default cap, in MiB

REFUSED = {
    "mixed_precision": "it casts parameters and gradients to another dtype, which "
    "changes the numbers; cast the model yourself (model.half()) instead",
    "delay_all_reduce_named_params": "it moves some all-reduces to another "
    "parameter's hook; every bucket here is all-reduced when it is full",
    "param_to_hook_all_reduce": "it only goes with delay_all_reduce_named_params",
    "skip_all_reduce_unused_params": "skipping the all-reduce of unused parameters "
    "leaves replicas apart if ranks differ in what they use",
    "bucket_cap_mb_list": "buckets here have one cap (bucket_cap_mb)",
}


@dataclass(frozen=True)
class DDPOptions:
    """What torch's DDP arguments mean for our DDP, resolved once at construction."""

    group: Group  # the process group that averages gradients (None: the default)
    device: torch.device | None  # forward moves inputs here (device_ids[0])
    output_device: torch.device | None  # kept, as torch keeps it; no effect
    dim: int  # kept, as torch keeps it; no effect with one device per process
    bucket_cap_mb: float  # bucket size in MiB (default 25)
    # a parameter without a gradient is sent as zeros (grad stays None if no rank
    # had one); without it, such a parameter is a RuntimeError naming it
    find_unused_parameters: bool
    gradient_as_bucket_view: bool  # .grad is a view into its bucket: one copy less
    init_sync: bool  # check shapes and copy rank 0's parameters at construction
    init_sync_buffers: bool  # ... and rank 0's buffers
    forward_sync_buffers: bool  # copy rank 0's buffers before every forward


def ddp_options(module: nn.Module, **args: Any) -> DDPOptions:
    """Resolve torch's DistributedDataParallel arguments (by name) for our DDP.

    Raises, before any collective, for refused arguments and for combinations torch
    refuses too (device_ids on a CPU or multi-device module, two groups at once).
    """
    for name, why in REFUSED.items():
        if args.get(name):
            raise NotImplementedError(f"DDP: {name} is not supported here: {why}")
    cap = args["bucket_cap_mb"]
    if cap is not None and not cap > 0:
        raise ValueError(f"bucket_cap_mb must be positive, got {cap}")
    device, output = _devices(module, args["device_ids"], args["output_device"])
    forward_sync, init_buffers = args["forward_sync_buffers"], True
    if forward_sync is None:  # torch: broadcast_buffers (deprecated) decides both
        broadcast = args["broadcast_buffers"]
        forward_sync = init_buffers = True if broadcast is None else bool(broadcast)
    return DDPOptions(
        group=_group(args["process_group"], args["group"], args["device_mesh"]),
        device=device,
        output_device=output,
        dim=args["dim"],
        bucket_cap_mb=DEFAULT_BUCKET_MB if cap is None else cap,
        # torch: with a static graph "it does not matter whether users set
        # find_unused_parameters"; here unused parameters are then handled alike
        find_unused_parameters=bool(
            args["find_unused_parameters"] or args["static_graph"]
        ),
        gradient_as_bucket_view=bool(args["gradient_as_bucket_view"]),
        init_sync=bool(args["init_sync"]),
        init_sync_buffers=init_buffers,
        forward_sync_buffers=bool(forward_sync),
    )


def _group(process_group: Group, group: Group, device_mesh: Any) -> Group:
    """The one process group named by `process_group`, `group` or a 1-D device mesh."""
    given = [
        option for option in (process_group, group, device_mesh) if option is not None
    ]
    if len(given) > 1:
        raise ValueError("DDP: pass one of process_group, group and device_mesh")
    if device_mesh is not None:
        if device_mesh.ndim != 1:
            raise ValueError(f"DDP: device_mesh must be 1-D, got {device_mesh.ndim}-D")
        return device_mesh.get_group(mesh_dim=0)
    return process_group if process_group is not None else group


def _devices(
    module: nn.Module, device_ids: Any, output_device: Any
) -> tuple[torch.device | None, torch.device | None]:
    """torch's rules: device_ids names the one CUDA device of a single-device module."""
    devices = {p.device for p in module.parameters()}
    if not device_ids:  # None or [] (torch accepts both)
        if output_device is not None:
            raise ValueError("DDP: output_device needs device_ids, as in torch")
        return None, None
    if len(device_ids) > 1:
        raise ValueError("DDP: device_ids can only be None or contain a single element")
    if len(devices) != 1 or next(iter(devices)).type == "cpu":
        raise ValueError(
            "DDP: device_ids and output_device only work with single-device GPU "
            f"modules, but got device_ids {device_ids} and module parameters on "
            f"{sorted(map(str, devices))}: pass device_ids=None, as torch requires"
        )
    device = _cuda(device_ids[0])
    if device != next(iter(devices)):
        raise ValueError(f"DDP: the module is on {next(iter(devices))}, not {device}")
    output = device if output_device is None else _cuda(output_device)
    return device, output


def _cuda(device: int | str | torch.device) -> torch.device:
    """torch.device for a CUDA index (3), name ("cuda:3") or device."""
    if isinstance(device, int):
        return torch.device("cuda", device)
    return torch.device(device)


def to_device(value: Any, device: torch.device) -> Any:
    """`value` with every tensor in it (in lists, tuples, dicts) moved to `device`.

    What torch's DDP does to forward's inputs when given device_ids.
    """
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (list, tuple)):
        moved = [to_device(v, device) for v in value]
        return moved if isinstance(value, list) else tuple(moved)
    if isinstance(value, dict):
        return {k: to_device(v, device) for k, v in value.items()}
    return value


def check_comm_hook(hook: Any, registered: bool, backward_ran: bool) -> None:
    """torch's checks on a comm hook: callable, and annotated (if at all) as torch's.

    A hook is `hook(state, bucket: dist.GradBucket) -> torch.futures.Future[Tensor]`;
    a wrong annotation is a ValueError, as in torch, so a hook written for torch's DDP
    and one written for ours are the same hook. RuntimeError for a second hook (as
    torch) and for one after the first backward (torch documents this rule; a hook
    arriving mid-training would change how gradients are averaged).
    """
    if not callable(hook):
        raise TypeError("Communication hook must be callable.")
    sig = inspect.signature(hook)
    bucket = sig.parameters["bucket"].annotation if "bucket" in sig.parameters else None
    if bucket not in (None, inspect.Parameter.empty, dist.GradBucket):
        raise ValueError(
            "Communication hook: bucket annotation should be dist.GradBucket."
        )
    returns = sig.return_annotation
    if returns not in (inspect.Signature.empty, torch.futures.Future[torch.Tensor]):
        raise ValueError(
            "Communication hook: return annotation should be "
            "torch.futures.Future[torch.Tensor]."
        )
    if registered:
        raise RuntimeError(
            "register_comm_hook or register_builtin_comm_hook can only be called once."
        )
    if backward_ran:
        raise RuntimeError(
            "DDP: register_comm_hook must be called before the first backward"
        )
