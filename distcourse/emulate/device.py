"""An emulated accelerator: tensors that report `gpu:<rank>` while their data live on
the host, so code that would break on a GPU box breaks here the same way.

How it works. torch lets a Python program own its PrivateUse1 dispatch key
(`torch.utils.backend_registration._setup_privateuseone_for_python_backend`, with
torch's own test test/test_privateuseone_python_backend.py as the model: it registers
`empty_strided` and `empty.memory_format` for the key with `torch.library`). The key
is renamed to DEVICE_TYPE ("gpu"): the name "cuda" cannot be used on a CUDA build of
torch without a GPU, since c10's CUDA device guard initialises the driver on the first
op and the process aborts. A device tensor is a wrapper subclass
(`torch.Tensor._make_wrapper_subclass`, the pattern of torch's subclass zoo and of
FakeTensor) holding a CPU tensor; `__torch_dispatch__` unwraps, checks the same-device
rule, runs the CPU kernel and wraps the result. Autograd runs above the wrapper, so
gradients of device parameters are device tensors.

The rules modelled, each from CUDA/torch behaviour:
- an op mixing a device tensor with a host tensor raises CUDA's message "Expected all
  tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"
  (torch's `TensorIterator` / `check_device` codegen); a 0-d CPU tensor is allowed,
  as CUDA kernels take CPU scalars ("cpu scalars" in aten's TensorIterator.cpp);
  copies (`copy_`, `_to_copy`) cross devices by design, and advanced indexing
  accepts host index tensors (aten's `index` moves indices to self's device);
- leaving the device (`.cpu()`, `.to("cpu")`, `.item()`, `.tolist()`, `bool(t)`)
  works and counts one host synchronization: on CUDA these wait for the device
  (CUDA semantics notes: "copies ... to CPU ... are synchronous").
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_map

from distcourse.emulate import completion, counters, kernels, rng, schema, timing
from distcourse.emulate.ordinal import DEVICE_TYPE, current, current_device

RULE_SAME_DEVICE = "same-device rule (emulated GPU)"

_aten = torch.ops.aten
# c10d's ops (torch.ops.c10d.*, _c10d_functional.*, DTensor's _dtensor.*) reach the
# wrapper first, which hands their group the host data; while the op runs, those
# still count as device tensors (`is_device_tensor`), so NCCL's host-tensor rule sees
# what the caller gave (a host tensor among the op's inputs is refused by the
# same-device rule first)
_COLLECTIVE_NAMESPACES = (
    "c10d",
    "_c10d_functional",
    "_c10d_functional_autograd",
    "_dtensor",
)
_in_collective = threading.local()

_CROSSING = {  # ops that move data between devices on purpose
    _aten.copy_.default,
    _aten._to_copy.default,
    _aten._copy_from.default,
    _aten._copy_from_and_resize.default,
}
_HOST_INDEXED = {  # advanced indexing takes index tensors from the host
    _aten.index.Tensor,
    _aten.index_put_.default,
    _aten.index_put.default,
    _aten._index_put_impl_.default,
}
_SCALAR_OUT = {_aten._local_scalar_dense.default}
_SEEDED = torch.Tag.nondeterministic_seeded

_state: dict[str, Any] = {"setup": False}


class DeviceRuleError(RuntimeError):
    """An op broke the same-device rule; the message is CUDA's, then the rule."""


# ---------------------------------------------------------------- the wrapper ----


class DeviceTensor(torch.Tensor):
    """A tensor on the emulated device: reports `gpu:<i>`, computes on `_host`."""

    _host: torch.Tensor
    _device: torch.device
    __slots__ = ("_device", "_host")

    @staticmethod
    def __new__(cls, host: torch.Tensor, device: torch.device) -> DeviceTensor:
        out = torch.Tensor._make_wrapper_subclass(
            cls,
            host.shape,
            strides=host.stride(),
            storage_offset=host.storage_offset(),
            dtype=host.dtype,
            layout=host.layout,
            device=torch.device(DEVICE_TYPE, 0),  # see `device` below
            requires_grad=False,
            # sizes and strides are asked of the host data (schema.SHAPE_QUERIES), so an
            # in-place resize_ or set_ (all_gather_object's, FSDP's) shows through
            dispatch_sizes_strides_policy="sizes",
        )
        out._host = host
        out._device = device
        return out

    # torch's Python PrivateUse1 device guard reports one device (deviceCount() ==
    # 1), and the autograd engine asserts every node's device index is below the
    # count: a backward on index 1 fails with "device.index() < ...
    # device_ready_queues_.size() INTERNAL ASSERT FAILED" (torch/csrc/acc/Module.cpp,
    # PythonDeviceGuard). So the C++ tensor says gpu:0 on every rank while Python
    # code, the same-device rule and printing see the rank's own `gpu:<i>`.
    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return self._device

    @property  # type: ignore[override]
    def data(self) -> torch.Tensor:
        return torch._C.TensorBase.data.__get__(self)

    @data.setter
    def data(self, new: torch.Tensor) -> None:
        """`p.data = q` (nn.Module.to(dtype) converts parameters so) copies q's
        metadata into p's C++ tensor; p's host data must follow, or p would say
        bfloat16 while computing in float32."""
        torch._C.TensorBase.data.__set__(self, new)
        self._host = new._host if isinstance(new, DeviceTensor) else new
        self._device = new.device if isinstance(new, DeviceTensor) else self._device

    def get_device(self) -> int:
        return self._device.index or 0

    __torch_function__ = torch._C._disabled_torch_function_impl

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        counters.count_host_sync("print")  # printing copies to the host, as on CUDA
        body = repr(self._host.detach())
        body = body[:-1] if body.endswith(")") else body
        grad = ", requires_grad=True" if self.requires_grad else ""
        return f"{body}, device='{self.device}'{grad})"

    def untyped_storage(self) -> torch.UntypedStorage:
        """The host storage behind the tensor: FSDP2 frees and re-allocates unsharded
        parameters by resizing it (`_fsdp_param.free_storage`/`alloc_storage`)."""
        return self._host.untyped_storage()

    def __reduce_ex__(self, proto: Any) -> Any:
        """Pickled as torch pickles a storage-less PrivateUse1 tensor (Tensor.
        _reduce_ex_internal): its host copy, rebuilt with `.to(device)` by a function
        `torch.load(weights_only=True)` accepts (and `map_location` redirects)."""
        return (
            torch._utils._rebuild_device_tensor_from_cpu_tensor,
            (self.cpu(), self.dtype, str(self._device), self.requires_grad),
        )

    def __deepcopy__(self, memo: dict) -> DeviceTensor:
        """A copy on the same device (torch's generic deepcopy of a tensor subclass
        rebuilds it with `set_`, which cannot reach a wrapper's sizes)."""
        if id(self) in memo:
            return memo[id(self)]
        new = wrap(self._host.detach().clone(), self._device)
        new.requires_grad_(self.requires_grad)
        if self.grad is not None:
            new.grad = copy.deepcopy(self.grad, memo)
        for key, value in self.__dict__.items():
            if not key.startswith(("_host", "_device", "_sym_")):  # _sym_: torch's
                setattr(new, key, copy.deepcopy(value, memo))  # cache of the sizes
        memo[id(self)] = new
        return new

    def data_ptr(self) -> int:
        """The host data's address: two views of one place compare equal, as on a
        GPU (the wrapper itself has no storage, and would answer 0 for all)."""
        return self._host.data_ptr()

    def tolist(self) -> Any:  # torch refuses .tolist() on subclasses: via the host
        return self.cpu().tolist()

    def numpy(self, *, force: bool = False) -> Any:
        """Refused as on CUDA (torch/csrc/utils/tensor_numpy.cpp's message)."""
        if force:
            return self.cpu().numpy()
        raise TypeError(
            f"can't convert {self.device} device type tensor to numpy. Use "
            "Tensor.cpu() to copy the tensor to host memory first."
        )

    @classmethod
    def __torch_dispatch__(
        cls, func: Any, types: Any, args: Any = (), kwargs: Any = None
    ) -> Any:
        if func in schema.SHAPE_QUERIES:
            return schema.SHAPE_QUERIES[func](args[0]._host)
        return _dispatch(func, args, kwargs or {})


def _dispatch(func: Any, args: Any, kwargs: dict) -> Any:
    devices: list[torch.device] = []
    hosts: list[torch.Tensor] = []
    inners: dict[int, DeviceTensor] = {}

    def unwrap(x: Any) -> Any:
        if isinstance(x, DeviceTensor):
            devices.append(x._device)
            inners[id(x._host)] = x
            return x._host
        if isinstance(x, torch.Tensor):
            hosts.append(x)
        return x

    h_args = tree_map(unwrap, args)
    h_kwargs = tree_map(unwrap, kwargs)
    h_args, h_kwargs = schema.device_by_name(func, list(h_args), h_kwargs)
    target = h_kwargs.get("device")
    leaving = synced = False  # leaving the device; waiting for it (to the host)
    made_on = None  # an op told where to put its result (`to`, `*_like`, `new_*`)
    if target is not None:
        target = torch.device(target)
        if target.type == DEVICE_TYPE:
            h_kwargs["device"] = torch.device("cpu")
            made_on = _factory_device(target)
        elif devices:  # to the host, or elsewhere (pipelining's shapes go to meta)
            leaving, synced = True, target.type == "cpu"
    if made_on is None and func not in _CROSSING:
        _check_same_device(func, devices, hosts)
    elif func is _aten.copy_.default and not isinstance(args[0], DeviceTensor):
        leaving = synced = True  # copy_(host_dst, device_src)
    later = synced and schema.non_blocking(func, h_args, h_kwargs)
    collective = func.namespace in _COLLECTIVE_NAMESPACES
    if func not in schema.METADATA and not func.is_view:
        timing.note_device_work(func)
        if completion.busy() and not collective:
            written = schema.written(func, h_args, h_kwargs)
            completion.check(func, [x._host for x in inners.values()], written)
    if collective:
        _in_collective.active = True
        try:
            out = func(*h_args, **h_kwargs)
        finally:
            _in_collective.active = False
    elif _SEEDED in func.tags:
        with rng.drawing((made_on or devices[0]).index or 0):
            out = func(*h_args, **h_kwargs)
    else:  # the host's kernel, or one that computes as CUDA's (kernels.HOST)
        out = kernels.HOST.get(func, func)(*h_args, **h_kwargs)
    if (synced and not later) or func in _SCALAR_OUT:
        counters.count_host_sync(str(func))
    if later:  # a non_blocking copy to the host: there when the stream is synced
        into = args[0] if func is _aten.copy_.default else None
        if into is not None and not into.is_pinned():  # pageable: CUDA copies now
            counters.count_host_sync(str(func))
            return out
        return completion.copied_later(out, into is None)
    if leaving:
        return out
    dev = made_on or devices[0]
    keep = {id(h) for h in hosts}

    def wrap_out(x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        if id(x) in inners:  # an in-place op or out=: give back the caller's object
            return inners[id(x)]  # (its sizes are its host data's, resized or not)
        if id(x) in keep:
            return x
        return wrap(x, dev)

    return tree_map(wrap_out, out)


def _check_same_device(
    func: Any, devices: list[torch.device], hosts: list[torch.Tensor]
) -> None:
    first = devices[0]
    for d in devices[1:]:
        if d != first:
            raise DeviceRuleError(_mixing_message(func, first, d))
    if func in _HOST_INDEXED:
        return
    for h in hosts:
        if h.device.type == "cpu" and h.dim() == 0:
            continue  # CUDA kernels accept a CPU scalar
        raise DeviceRuleError(_mixing_message(func, first, h.device))


def _mixing_message(func: Any, a: torch.device, b: torch.device) -> str:
    return (
        "Expected all tensors to be on the same device, but found at least two "
        f"devices, {a} and {b}! [{RULE_SAME_DEVICE}: {func} got a tensor on {b}"
        f"{completion.place()}; move it with .to({str(a)!r}) (or runtime.device()) "
        "first]"
    )


def _with_index(device: torch.device) -> torch.device:
    if device.index is None:
        return torch.device(DEVICE_TYPE, current_device())
    return device


# ------------------------------------------------------------------ interface ----


def wrapper_device(device: torch.device) -> torch.device:
    """The device to give a tensor subclass that wraps one on `device` (a global
    tensor, say): C++ must see every emulated tensor as gpu:0 (DeviceTensor.device
    says why); any other device is itself."""
    return torch.device(DEVICE_TYPE, 0) if device.type == DEVICE_TYPE else device


def is_device_tensor(t: Any) -> bool:
    """True for a tensor on the emulated device (the wrapper), or the host data of
    one that a c10d op running now was given."""
    return isinstance(t, DeviceTensor) or _passed_to_collective(t)


def _passed_to_collective(t: Any) -> bool:
    """Inside a c10d op the wrapper dispatched (its inputs all device tensors, as
    `_check_same_device` saw), a host tensor is device data: an input's, or an output
    the op made on the host."""
    return isinstance(t, torch.Tensor) and getattr(_in_collective, "active", False)


def host_data(t: torch.Tensor) -> torch.Tensor:
    """The CPU tensor behind a device tensor, sharing its memory: writing into it in
    place is seen through `t` and every view of `t`. No sync is counted (this is the
    emulation's own door, for the emulated collectives)."""
    if _passed_to_collective(t):
        return t
    if not isinstance(t, DeviceTensor):
        raise TypeError(f"host_data expects an emulated device tensor, got {t.device}")
    return t._host


def wrap(host: torch.Tensor, device: torch.device | str | int) -> torch.Tensor:
    """A device tensor on `device` (index or "gpu:i") whose data are `host` (shared)."""
    if isinstance(device, int):
        device = torch.device(DEVICE_TYPE, device)
    device = _with_index(torch.device(device))
    if device.type != DEVICE_TYPE:
        raise ValueError(f"wrap: {device} is not the emulated device {DEVICE_TYPE!r}")
    if isinstance(host, DeviceTensor) or host.device.type != "cpu":
        raise TypeError(f"wrap expects a CPU tensor, got one on {host.device}")
    counters.track(host)
    return DeviceTensor(host.detach(), device)


# --------------------------------------------------------------- registration ----


def _factory_device(device: Any) -> torch.device:
    """The device a factory kernel was asked for. C++ knows every device tensor as
    gpu:0 (see DeviceTensor.device), so code that allocates from a tensor's C++
    options (DDP's reducer buckets, say) asks for gpu:0: that means this process's
    current device. The price: an explicit "gpu:0" on another rank is not caught."""
    device = torch.device(device or DEVICE_TYPE)
    if device.index in (None, 0):
        return current()
    return device


def _empty_strided(size: Any, stride: Any, **kw: Any) -> torch.Tensor:
    host = torch.empty_strided(size, stride, dtype=kw.get("dtype"))
    return wrap(host, _factory_device(kw.get("device")))


def _empty(size: Any, **kw: Any) -> torch.Tensor:
    fmt = kw.get("memory_format")
    host = torch.empty(size, dtype=kw.get("dtype"), memory_format=fmt)
    return wrap(host, _factory_device(kw.get("device")))


# Factories that aten writes as `empty({0})` then an out= kernel that resizes: the
# wrapper's sizes cannot follow a resize made from C++, so they run on the host and
# are wrapped whole.
_SIZED_FACTORIES = (
    "arange",
    "arange.start",
    "arange.start_step",
    "linspace",
    "logspace",
    "eye",
    "eye.m",
    "randperm",
    "randperm.generator",
)


def _host_factory(op: Any) -> Callable[..., torch.Tensor]:
    def run(*args: Any, **kw: Any) -> torch.Tensor:
        target = _factory_device(kw.pop("device", None))
        with rng.drawing(target.index or 0):  # randperm draws from the device's
            return wrap(op(*args, **kw, device="cpu"), target)

    return run


def _copy_from(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> Any:
    """Reached with Python dispatch off (e.g. `torch.tensor(..., device=...)`)."""
    src_host = src._host if isinstance(src, DeviceTensor) else src
    if isinstance(dst, DeviceTensor):
        dst._host.copy_(src_host)
    else:
        counters.count_host_sync("copy to host")
        dst.copy_(src_host)
    return dst


def _keep_on_host(storage: Any, location: str) -> Any:
    """torch.load with map_location on the emulated device: a storage cannot live
    there (device data live in wrappers), so it stays on the host; device tensors
    then rebuild themselves with `.to(device)` (see DeviceTensor.__reduce_ex__). A
    plain tensor saved from the host comes back on the host (CUDA would move it)."""
    return storage if location.startswith(DEVICE_TYPE) else None


def _no_tag(storage: Any) -> None:
    return None


def enabled() -> bool:
    """True once `setup()` has run in this process."""
    return bool(_state["setup"])


def register(backend_module: Any) -> None:
    """Register the emulated device in this process (safe to call again), with
    `backend_module` as what `torch.gpu` answers (devicemodule.setup passes it).

    torch allows the PrivateUse1 backend to be renamed once per process, so a second
    call returns at once; a process whose key already has another name is refused.
    """
    if _state["setup"]:
        return
    from torch.utils import backend_registration as reg

    name = torch._C._get_privateuse1_backend_name()
    if name not in ("privateuseone", DEVICE_TYPE):
        raise RuntimeError(f"PrivateUse1 is already taken by {name!r} in this process")
    reg._setup_privateuseone_for_python_backend(
        rename=DEVICE_TYPE, backend_module=backend_module
    )
    lib = torch.library.Library("aten", "IMPL")  # noqa: TOR901 (kept alive below)
    lib.impl("empty_strided", _empty_strided, "PrivateUse1")
    lib.impl("empty.memory_format", _empty, "PrivateUse1")
    lib.impl("_copy_from", _copy_from, "PrivateUse1")
    for name in _SIZED_FACTORIES:
        packet, _, overload = name.partition(".")
        op = getattr(getattr(_aten, packet), overload or "default")
        lib.impl(name, _host_factory(op), "PrivateUse1")
    torch.serialization.register_package(5, _no_tag, _keep_on_host)
    _state["library"] = lib
    _state["setup"] = True
