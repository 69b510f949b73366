"""CUDA's autocast policy on the emulated GPU, read from the installed torch.

`torch.autocast("gpu", ...)` turns on the dispatch key AutocastPrivateUse1, where
torch registers no kernel for most ops. A real GPU runs CUDA's policy: ATen's
autocast_mode.cpp registers, for the AutocastCUDA key, the op lists that torch ships
in its C++ header ATen/autocast_mode.h (under torch/include). This module reads those
lists from the installed torch's header, not from a copy, and registers the same
policy for the emulated device:

- AT_FORALL_LOWER_PRECISION_FP: floating inputs cast to the autocast dtype (matmuls,
  convolutions, attention);
- AT_FORALL_FP32: inputs cast to float32 (layer_norm, rms_norm, the losses, exp, log,
  pow ...);
- AT_FORALL_FP32_SET_OPT_DTYPE: float32 unless the call names a dtype (softmax,
  log_softmax, sum, cumsum, prod, the vector and matrix norms): so a bf16 softmax
  returns float32, and cross_entropy's log_softmax, which passes its input's dtype,
  stays in bf16 (as the H200 ran it);
- AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE: `norm` with a float32 dtype appended;
- AT_FORALL_PROMOTE: every floating input cast to the widest among them.

An entry `_(name)` is the op's default overload, `_(name, overload)` that overload,
as the header's KERNEL macros register them. An input is cast when it is a floating
tensor on the device and not float64 (`is_autocast_eligible`). Not modelled: the
cast cache torch keeps for leaf weights inside one autocast region (a weight used
twice is cast twice here).

One rule is not in the header: autocast_mode.cpp bans `binary_cross_entropy` under
CUDA's autocast (`binary_cross_entropy_banned`), with the message in BANNED; here it
is refused the same way.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import torch
from torch.utils._pytree import tree_map

from distcourse.emulate.ordinal import DEVICE_TYPE

HEADER = Path(torch.__file__).parent / "include" / "ATen" / "autocast_mode.h"
LISTS = {  # policy -> the header's macro listing its ops
    "lower_precision_fp": "AT_FORALL_LOWER_PRECISION_FP",
    "fp32": "AT_FORALL_FP32",
    "fp32_set_opt_dtype": "AT_FORALL_FP32_SET_OPT_DTYPE",
    "fp32_append_dtype": "AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE",
    "promote": "AT_FORALL_PROMOTE",
}
RULE_BANNED = "autocast rule: an op CUDA's autocast refuses"
BANNED = {  # autocast_mode.cpp, binary_cross_entropy_banned (torch's message)
    "binary_cross_entropy": (
        "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe "
        "to autocast.\nMany models use a sigmoid layer right before the binary "
        "cross entropy layer.\nIn this case, combine the two layers using "
        "torch.nn.functional.binary_cross_entropy_with_logits\nor "
        "torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and "
        "BCEWithLogits are\nsafe to autocast."
    ),
}
KEY = "AutocastPrivateUse1"
_NO_AUTOCAST = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)
_aten = torch.ops.aten


def read_policy(header: Path = HEADER) -> dict[str, list[tuple[str, str]]]:
    """{policy: [(op name, overload), ...]} as the header lists them ("default"
    where an entry names no overload). Raises if a list is missing."""
    text = header.read_text()
    found: dict[str, list[tuple[str, str]]] = {}
    for policy, macro in LISTS.items():
        match = re.search(rf"#define {macro}\(_\)((?:.*\\\n)*.*)", text)
        if match is None:
            raise RuntimeError(f"{header} has no {macro}: cannot read CUDA's autocast")
        body = match.group(1)
        if policy == "fp32_append_dtype":  # entries name "op.overload" in quotes
            pairs = re.findall(r'"(\w+)\.(\w+)"', body)
        else:
            pairs = [
                (name, overload or "default")
                for name, overload in re.findall(r"_\((\w+)(?:,\s*(\w+))?\)", body)
            ]
        found[policy] = pairs
    return found


def eligible(x: Any) -> bool:
    """`is_autocast_eligible`: a floating tensor on the device, not float64."""
    return (
        isinstance(x, torch.Tensor)
        and x.device.type == DEVICE_TYPE
        and x.is_floating_point()
        and x.dtype != torch.float64
    )


def _cast(dtype: torch.dtype, x: Any) -> Any:
    return x.to(dtype) if eligible(x) and x.dtype != dtype else x


def _tensors(args: Any) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    tree_map(lambda x: out.append(x) if isinstance(x, torch.Tensor) else None, args)
    return out


def _run(op: Any, args: tuple, kwargs: dict) -> Any:
    """Run `op` below autocast (as ATen's autocast kernels redispatch)."""
    with torch._C._ExcludeDispatchKeyGuard(_NO_AUTOCAST):
        return op(*args, **kwargs)


def _lower(op: Any, *args: Any, **kwargs: Any) -> Any:
    dtype = torch.get_autocast_dtype(DEVICE_TYPE)
    args, kwargs = tree_map(functools.partial(_cast, dtype), (args, kwargs))
    return _run(op, args, kwargs)


def _fp32(op: Any, *args: Any, **kwargs: Any) -> Any:
    args, kwargs = tree_map(functools.partial(_cast, torch.float32), (args, kwargs))
    return _run(op, args, kwargs)


def _dtype_index(op: Any) -> int:
    for i, arg in enumerate(op._schema.arguments):
        if arg.name == "dtype":
            return i
    raise ValueError(f"{op} has no dtype argument")


def _set_opt_dtype(op: Any, *args: Any, **kwargs: Any) -> Any:
    """float32 if the first tensor is eligible and no dtype is given."""
    i = _dtype_index(op)
    given = kwargs.get("dtype") if i >= len(args) else args[i]
    tensors = _tensors(args)
    if given is None and tensors and eligible(tensors[0]):
        if i < len(args):
            args = (*args[:i], torch.float32, *args[i + 1 :])
        else:
            kwargs = {**kwargs, "dtype": torch.float32}
    return _run(op, args, kwargs)


def _append_dtype(op: Any, *args: Any, **kwargs: Any) -> Any:
    """`norm.X` as `norm.X_dtype` with float32 (fp32_append_dtype)."""
    tensors = _tensors(args)
    if not (tensors and eligible(tensors[0])):
        return _run(op, args, kwargs)
    with_dtype = getattr(op.overloadpacket, f"{op._overloadname}_dtype", None)
    if with_dtype is None:  # norm.Scalar appends to norm.ScalarOpt_dtype
        with_dtype = op.overloadpacket.ScalarOpt_dtype
    return _run(with_dtype, args, {**kwargs, "dtype": torch.float32})


def _promote(op: Any, *args: Any, **kwargs: Any) -> Any:
    widest = torch.get_autocast_dtype(DEVICE_TYPE)
    for t in _tensors((args, kwargs)):
        if eligible(t):
            widest = torch.promote_types(widest, t.dtype)
    args, kwargs = tree_map(functools.partial(_cast, widest), (args, kwargs))
    return _run(op, args, kwargs)


def _banned(name: str, *args: Any, **kwargs: Any) -> Any:
    raise RuntimeError(f"{BANNED[name]} [{RULE_BANNED}: {name} on the emulated GPU]")


_POLICIES = {
    "lower_precision_fp": _lower,
    "fp32": _fp32,
    "fp32_set_opt_dtype": _set_opt_dtype,
    "fp32_append_dtype": _append_dtype,
    "promote": _promote,
}


def register(library: torch.library.Library) -> list[str]:
    """Register CUDA's policy under AutocastPrivateUse1 in `library` (an aten IMPL
    library); return the entries of the header that name no op of this torch."""
    missing = []
    for policy, pairs in read_policy().items():
        for name, overload in pairs:
            op = getattr(getattr(_aten, name, None), overload, None)
            if op is None:
                missing.append(f"{name}.{overload}")
                continue
            library.impl(op, functools.partial(_POLICIES[policy], op), KEY)
    for name in BANNED:
        for overload in getattr(_aten, name).overloads():
            op = getattr(getattr(_aten, name), overload)
            library.impl(op, functools.partial(_banned, name), KEY)
    return missing
