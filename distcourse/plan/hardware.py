"""The machine a plan runs on: a compute rate, memory per GPU, and an alpha-beta model
of two kinds of link (inside a node, between nodes).

Keys (`Hardware.to_dict`, stable): name, flops_fp32, flops_bf16 (peak FLOP/s per
GPU), efficiency (the share of peak a step's matmuls reach), memory (bytes per
GPU), gpus_per_node, alpha_node, beta_node, alpha_network, beta_network (seconds
per message step, seconds per byte), source.

Named GPUs take their figures from NVIDIA's datasheets (dense, without sparsity:
the datasheets print the sparse figure, twice the dense one):

    H100 SXM  https://www.nvidia.com/en-us/data-center/h100/  FP32 67 TFLOPS,
              BF16 1,979 TFLOPS sparse = 989.5 dense, 80 GB, NVLink 900 GB/s
    H200 SXM  https://www.nvidia.com/en-us/data-center/h200/  FP32 67 TFLOPS,
              BF16 1,979 sparse = 989.5 dense, 141 GB, NVLink 900 GB/s
    A100 SXM  https://www.nvidia.com/en-us/data-center/a100/  FP32 19.5 TFLOPS,
              BF16 624 sparse = 312 dense, 80 GB, NVLink 600 GB/s

NVLink's figure counts both directions: beta_node = 1 / (half of it). Between
nodes, one NIC per GPU as in NVIDIA's DGX systems: ConnectX-7 400 Gb/s (DGX H100,
DGX H200: https://docs.nvidia.com/dgx/dgxh100-user-guide/introduction-to-dgxh100.html)
= 50 GB/s a direction; ConnectX-6 200 Gb/s (DGX A100:
https://docs.nvidia.com/dgx/dgxa100-user-guide/introduction-to-dgxa100.html) = 25
GB/s. Latencies are on no datasheet: alpha_node 5 us and alpha_network 10 us per
message step are assumptions (the order of NCCL's small-message times), and so is
the efficiency 0.5 (a well-tuned large model reaches 40-55 % of BF16 peak). Eight
GPUs a node.

On the reader's machine (`local`): alpha and beta from chapter 2's fit
(`comm.costmodel.fit_collective`) and the rate of a matmul timed here
(`matmul_rate`), efficiency 1 (the rate is already what a matmul reaches).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

from distcourse import clock
from distcourse.plan.spec import from_plain

GB = 10**9


@dataclass(frozen=True)
class Hardware:
    """Compute rate, memory and links of one GPU (or CPU rank) of a machine."""

    name: str
    flops_fp32: float
    flops_bf16: float
    efficiency: float
    memory: int
    gpus_per_node: int
    alpha_node: float
    beta_node: float
    alpha_network: float
    beta_network: float
    source: str = ""

    def __post_init__(self) -> None:
        for name in ("flops_fp32", "flops_bf16", "efficiency", "memory"):
            if not getattr(self, name) > 0:
                raise ValueError(
                    f"{name} must be positive, got {getattr(self, name)!r}"
                )
        for name in ("alpha_node", "beta_node", "alpha_network", "beta_network"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if isinstance(self.gpus_per_node, bool) or not (
            isinstance(self.gpus_per_node, int) and self.gpus_per_node >= 1
        ):
            raise ValueError(
                f"gpus_per_node must be an integer >= 1, got {self.gpus_per_node!r}"
            )

    def rate(self, dtype: str) -> float:
        """FLOP/s a step reaches: the dtype's peak x efficiency."""
        peak = self.flops_fp32 if dtype == "fp32" else self.flops_bf16
        return peak * self.efficiency

    def link(self, where: str) -> tuple[float, float]:
        """(alpha, beta) of 'node' or 'network'."""
        if where == "network":
            return self.alpha_network, self.beta_network
        return self.alpha_node, self.beta_node

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Hardware:
        return from_plain(cls, data)


def _datasheet(
    name: str,
    fp32: float,
    bf16: float,
    memory_gb: int,
    nvlink: float,
    nic: float,
    url: str,
) -> Hardware:
    return Hardware(
        name=name,
        flops_fp32=fp32 * 1e12,
        flops_bf16=bf16 * 1e12,
        efficiency=0.5,
        memory=memory_gb * GB,
        gpus_per_node=8,
        alpha_node=5e-6,
        beta_node=1 / (nvlink / 2 * GB),
        alpha_network=10e-6,
        beta_network=1 / (nic * GB),
        source=url,
    )


GPUS: dict[str, Hardware] = {
    "h100": _datasheet(
        "H100 SXM",
        67,
        989.5,
        80,
        900,
        50,
        "https://www.nvidia.com/en-us/data-center/h100/",
    ),
    "h200": _datasheet(
        "H200 SXM",
        67,
        989.5,
        141,
        900,
        50,
        "https://www.nvidia.com/en-us/data-center/h200/",
    ),
    "a100": _datasheet(
        "A100 SXM 80GB",
        19.5,
        312,
        80,
        600,
        25,
        "https://www.nvidia.com/en-us/data-center/a100/",
    ),
}


def named(name: str) -> Hardware:
    """A datasheet GPU by name: h100, h200 or a100."""
    key = name.lower()
    if key not in GPUS:
        raise ValueError(f"unknown GPU {name!r}: use one of {', '.join(GPUS)}")
    return GPUS[key]


def local(
    alpha: float,
    beta: float,
    flops: float,
    memory: int,
    ranks: int,
    name: str = "this machine",
) -> Hardware:
    """The reader's machine: `ranks` ranks in one node, measured alpha, beta, rate."""
    return Hardware(
        name=name,
        flops_fp32=flops,
        flops_bf16=flops,
        efficiency=1.0,
        memory=memory,
        gpus_per_node=ranks,
        alpha_node=alpha,
        beta_node=beta,
        alpha_network=alpha,
        beta_network=beta,
        source="measured: comm.costmodel fit and plan.hardware.matmul_rate",
    )


def matmul_rate(
    size: int = 256,
    repeats: int = 20,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> float:
    """FLOP/s of a (size x size) @ (size x size) matmul on `device` (on CPU, this
    process's threads): 2 size^3 per product, the median of `repeats` after one
    warm-up, each timed on the device (`clock.timed`: CUDA events on a GPU)."""
    a = torch.randn(size, size, dtype=dtype, device=device)
    b = torch.randn(size, size, dtype=dtype, device=device)
    torch.mm(a, b)
    times = [clock.timed(lambda: torch.mm(a, b), a.device) for _ in range(repeats)]
    return 2 * size**3 / sorted(times)[repeats // 2]
