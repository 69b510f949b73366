"""Emulated GPU ranks: NCCL's and CUDA's rules on a CPU machine (issue 36).

`DISTCOURSE_DEVICE=emulated` gives each rank a device `gpu:<local rank>` whose tensors
live in host memory but behave like an accelerator's: a host tensor mixed into a device
op is refused with CUDA's message, leaving the device is counted as a host
synchronization. This package sits just below `distcourse.runtime` and never imports
it (or the mesh, or comm).

The interface other modules rely on (kept stable):
- `DEVICE_TYPE`: the device type name ("gpu");
- `setup()`: register the device in this process (idempotent); `enabled()`;
- `is_device_tensor(t)`, `host_data(t)` (the CPU tensor behind `t`, sharing memory),
  `wrap(cpu_tensor, device)`;
- `host_syncs()`, `reset_host_syncs()`, `count_host_sync(where)`, `add_sync_hook(fn)`;
- `DeviceRuleError`, `RULE_SAME_DEVICE`;
- `rank_device(local_rank, local_world_size)` (what the runtime calls), `current()`;
- `host_for(what, device)`, `host_runs()`: run something on the host, said aloud.
- `wrapper_device(device)`: the device for a tensor subclass wrapping a device tensor
  (C++ must see gpu:0; global tensors use it).

torch's production modules on 2 emulated ranks (torch 2.14; the ranks' default group
is emulated NCCL, `nccl.py`): DDP, DTensor's `distribute_tensor` and `redistribute`,
`parallelize_module`, `fully_shard` and `pipelining`'s GPipe all run on device tensors
and match a one-process CPU run (tests/test_emulate_device_torch.py). None needs
`host_for` today; it is the one way to run a module on the host should one stop
working.

Held to a real GPU, not to the CPU: `completion.py` holds an async op's results back
until `wait()` or a synchronize and refuses a send buffer changed before its wait and
a non-blocking copy to the host read before a synchronize; `timing.py` counts every
kernel as pending device work; `autocast.py` applies CUDA's autocast policy read from
the installed torch's header; `attention.py` runs the SDPA kernel CUDA chooses
(`distcourse.sdpa`) keeping what it keeps; `kernels.py` registers both and computes
layer norm's statistics as CUDA does; `rng.py` gives each device its own generator;
`recorder.py` records traces that compare across machines (tests/data/gpu_traces/).

What is not modelled: kernel numerics (every kernel computes on the host), streams'
concurrency (one in-order queue), memory limits, speeds, one process driving two
devices through one backward. C++ knows every device tensor as gpu:0 (see
`device.DeviceTensor.device`), so a factory asked for gpu:0 lands on the current
device.
"""

from distcourse.emulate.counters import (
    add_sync_hook,
    count_host_sync,
    host_syncs,
    reset_host_syncs,
)
from distcourse.emulate.device import (
    DEVICE_TYPE,
    RULE_SAME_DEVICE,
    DeviceRuleError,
    enabled,
    host_data,
    is_device_tensor,
    wrap,
    wrapper_device,
)
from distcourse.emulate.devicemodule import current, rank_device, setup
from distcourse.emulate.host import host_for, host_runs

__all__ = [
    "DEVICE_TYPE",
    "RULE_SAME_DEVICE",
    "DeviceRuleError",
    "add_sync_hook",
    "count_host_sync",
    "current",
    "enabled",
    "host_data",
    "host_for",
    "host_runs",
    "host_syncs",
    "is_device_tensor",
    "rank_device",
    "reset_host_syncs",
    "setup",
    "wrap",
    "wrapper_device",
]
