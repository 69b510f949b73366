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
- `rank_device(local_rank, local_world_size)` (what the runtime calls), `current()`.
"""

from distcourse.emulate.device import (
    DEVICE_TYPE,
    RULE_SAME_DEVICE,
    DeviceRuleError,
    add_sync_hook,
    count_host_sync,
    enabled,
    host_data,
    host_syncs,
    is_device_tensor,
    reset_host_syncs,
    setup,
    wrap,
)
from distcourse.emulate.devicemodule import current, rank_device

__all__ = [
    "DEVICE_TYPE",
    "RULE_SAME_DEVICE",
    "DeviceRuleError",
    "add_sync_hook",
    "count_host_sync",
    "current",
    "enabled",
    "host_data",
    "host_syncs",
    "is_device_tensor",
    "rank_device",
    "reset_host_syncs",
    "setup",
    "wrap",
]
