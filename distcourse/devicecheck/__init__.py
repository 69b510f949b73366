"""`python -m distcourse.devicecheck [PATH ...]`: tensors stay on the rank's device.

On NCCL every tensor a collective touches must be on the rank's GPU, and a mesh or a
placement must name the rank's device type. CI has no GPU, so nothing there runs the
NCCL path; this check reads the code instead (its AST: nothing is run or imported) of
notebook rank cells (`%%px` / `%%ranks`, and the functions a notebook hands to
`spawn`), scripts and package modules, and refuses:

- a tensor made by a factory (`torch.tensor`, `torch.zeros`, `torch.randn`, ...)
  without `device=` that reaches a `torch.distributed` collective or point-to-point
  call, directly, through a local name, or through a local function that passes its
  argument on (`dist.send(torch.tensor([3.0]), dst=1)` fails on NCCL with "No backend
  type associated with device type cpu");
- a literal "cpu" as the device type of `placement`, `init_device_mesh`, `DeviceMesh`
  or `Mesh(..., device_type=...)`, and a `placement(...)` with no device type (its
  default is the CPU): write the rank's device type (`device.type`);
- a module built on the host, a class called with no device among its arguments
  (`TinyGPT(cfg)`, not moved by `.to(...)` since), handed to a call that runs it on
  the rank's tensors (`DistributedDataParallel`, `DDP`, `fully_shard`,
  `parallelize_block`, `MixedPrecision`, `ContextGPT`, ...): on a GPU rank its
  first op raises "Expected all tensors to be on the same device" (or NCCL refuses
  its parameters). Containers (`nn.Sequential`) are left alone: their device is
  their children's.

A deliberate host tensor says so with a trailing `# devicecheck: host` comment on the
line that makes or sends it (rare, and explained beside it). Each refusal is printed
as `path[:cell N]:line: message` (N: the cell's index in the notebook, line: within
the cell); the exit status is 1 if there is any, else 0. Default paths: book/,
book/scripts/ and distcourse/. Pure AST: importing this package does not import torch.
"""

from distcourse.devicecheck.rules import Checker, Refusal, Unit
from distcourse.devicecheck.sources import check_file, check_paths, main

__all__ = ["Checker", "Refusal", "Unit", "check_file", "check_paths", "main"]
