"""`python -m distcourse [check]`: what this machine offers, then a 2-rank test.

It also says whether the installed torch is in the range the package supports and
tests (`torchcompat.SUPPORTED`), and shows the versions that matter (torch,
ipyparallel, jupyter-book, nbval) and whether they are the ones in requirements.lock,
the ones the stored outputs were made with.
"""

from __future__ import annotations

import platform
import sys
import time

import torch
import torch.distributed as dist

from distcourse import envcheck, runtime, torchcompat
from distcourse.launch import spawn


def _all_reduce_rank_ids() -> float:
    t = torch.tensor([float(dist.get_rank() + 1)], device=runtime.device())
    dist.all_reduce(t)
    return t.item()


def check(world_size: int = 2) -> int:
    """Print torch, backends and GPUs; start `world_size` ranks; run one all_reduce.

    Between the two, the key versions against requirements.lock: a mismatch is
    reported, not an error, since it explains a notebook output that differs but
    does not stop the ranks from working.
    """
    gpus = runtime.gpu_count()
    print(f"python     {platform.python_version()} on {platform.machine()}")
    print(f"torch      {torch.__version__} (CUDA build: {torch.version.cuda or 'no'})")
    print(torchcompat.support_report())
    print(f"backends   gloo={dist.is_gloo_available()} nccl={dist.is_nccl_available()}")
    print(
        f"GPUs       {gpus}"
        + "".join(f"\n  cuda:{i}  {torch.cuda.get_device_name(i)}" for i in range(gpus))
    )
    print("\n".join(envcheck.key_versions_report()))
    backend, device = runtime.pick_backend(0, world_size)
    print(f"{world_size} ranks would use {backend} on {device.type}")
    start = time.perf_counter()
    sums = spawn(_all_reduce_rank_ids, world_size)
    took = time.perf_counter() - start
    expected = world_size * (world_size + 1) / 2
    ok = all(s == expected for s in sums)
    print(
        f"all_reduce of rank+1 on {world_size} ranks: {sums} (expected {expected}) "
        f"in {took:.2f} s -> {'OK' if ok else 'WRONG'}"
    )
    return 0 if ok else 1


def main(argv: list[str]) -> int:
    if argv and argv[0] not in ("check",):
        print("usage: python -m distcourse [check]")
        return 2
    return check()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
