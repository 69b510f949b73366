"""The machine a plan runs on: compute rates per dtype, memory bandwidth, memory per
GPU (as the GPU reports it, and what it must keep free), and an alpha-beta model of
two kinds of link (inside a node, between nodes).

Keys (`Hardware.to_dict`, stable): name, flops_fp32, flops_bf16 (peak FLOP/s per
GPU), efficiency_fp32, efficiency_bf16 (the share of that peak a step's matmuls
reach), bandwidth (peak memory bytes/s), efficiency_memory (the share of it
element-wise kernels reach), memory (bytes per GPU, as nvidia-smi reports them),
workspace (bytes torch's allocator gives cuBLAS), context (bytes the CUDA context
takes outside torch's allocator), nccl (bytes each NCCL communicator allocates
outside it), gpus_per_node, alpha_node, beta_node, alpha_network, beta_network
(seconds per message step, seconds per byte), arch ("sm90", "sm80": the compute
capability whose attention kernels run; "cpu"), source.

Named GPUs take their figures from NVIDIA's datasheets (dense, without sparsity:
the datasheets print the sparse figure, twice the dense one):

    H100 SXM  https://www.nvidia.com/en-us/data-center/h100/  FP32 67 TFLOPS,
              BF16 1,979 TFLOPS sparse = 989.5 dense, HBM3 3.35 TB/s, NVLink
              900 GB/s
    H200 SXM  https://www.nvidia.com/en-us/data-center/h200/  FP32 67 TFLOPS,
              BF16 1,979 sparse = 989.5 dense, HBM3e 4.8 TB/s, NVLink 900 GB/s
    A100 SXM  https://www.nvidia.com/en-us/data-center/a100/  FP32 19.5 TFLOPS,
              BF16 624 sparse = 312 dense, HBM2e 2,039 GB/s, NVLink 600 GB/s

Memory is what nvidia-smi reports, in MiB: an H100 "80 GB" has 81,559 MiB (79.6
GiB), an H200 "141 GB" 143,771 MiB (both read on the machines, 2026-12-04), an
A100 80GB 81,920 MiB. The datasheet's "GB" of a GPU is close to GiB, not 10^9.

NVLink's figure counts both directions: beta_node = 1 / (half of it). Between
nodes, one NIC per GPU as in NVIDIA's DGX systems: ConnectX-7 400 Gb/s (DGX H100,
DGX H200: https://docs.nvidia.com/dgx/dgxh100-user-guide/introduction-to-dgxh100.html)
= 50 GB/s a direction; ConnectX-6 200 Gb/s (DGX A100:
https://docs.nvidia.com/dgx/dgxa100-user-guide/introduction-to-dgxa100.html) = 25
GB/s. Latencies are on no datasheet: alpha_node 5 us and alpha_network 10 us per
message step are assumptions (the order of NCCL's small-message times). Eight GPUs
a node.

Reached rates, from one H200 (torch 2.11.0+cu130, eager, 2026-12-04,
tests/data/gpu_measurements.json): a 1.34B TinyGPT's fp32 step ran at 0.79 of the
fp32 peak with almost nothing but matmuls in it, so efficiency_fp32 0.8; its bf16
autocast step at 0.485 of the bf16 peak, which, less the step's element-wise work at
efficiency_memory, leaves the matmuls 0.65 of it: efficiency_bf16 0.65 (a fit to
that one row, taken for the three GPUs). efficiency_memory 0.8 is an assumption
(element-wise kernels stream at most of HBM's peak).

Memory the step's own tensors do not use: cuBLAS's workspace, which torch allocates
through its caching allocator (so `max_memory_allocated` counts it), one per handle
and stream, and the forward and the backward (autograd's device thread) each take a
handle: 2 x 32 MiB on sm90 (torch's default CUBLAS_WORKSPACE_CONFIG, :4096:8 on
Hopper; aten/src/ATen/cuda/CublasHandlePool.cpp), 2 x 8,519,680 bytes before
(:4096:2:16:8). The fp32 H200 row holds 68.9 MB beyond its weights and AdamW's
moments after its warm-up steps. Outside the allocator, and so outside the plan's
total but kept free by `fits`: the CUDA context (context, 0.5 GiB assumed: the
order of what a CUDA 12-13 context with lazily loaded kernels takes) and NCCL's
buffers (nccl, 0.5 GiB per communicator assumed: NCCL allocates channel buffers of
NCCL_BUFFSIZE, 4 MiB by default, per peer and protocol).

On the reader's machine (`local`): alpha and beta from chapter 2's fit
(`comm.costmodel.fit_collective`), the rate of a matmul timed here (`matmul_rate`)
and of a copy (`copy_rate`), efficiencies 1 (the rates are already what a matmul
and a copy reach), no workspace, context or NCCL, arch "cpu".
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

from distcourse import clock
from distcourse.parallel.tensor.dtypes import Precision, rules_for
from distcourse.plan.spec import DTypePolicy, from_plain

GB = 10**9
MIB = 2**20
ARCHES = ("sm80", "sm90", "cpu")


@dataclass(frozen=True)
class Hardware:
    """Compute rates, memory and links of one GPU (or CPU rank) of a machine."""

    name: str
    flops_fp32: float
    flops_bf16: float
    efficiency_fp32: float
    efficiency_bf16: float
    bandwidth: float
    efficiency_memory: float
    memory: int
    workspace: int
    context: int
    nccl: int
    gpus_per_node: int
    alpha_node: float
    beta_node: float
    alpha_network: float
    beta_network: float
    arch: str = "sm90"
    source: str = ""

    def __post_init__(self) -> None:
        positive = ("flops_fp32", "flops_bf16", "efficiency_fp32", "efficiency_bf16")
        for name in (*positive, "bandwidth", "efficiency_memory", "memory"):
            if not getattr(self, name) > 0:
                raise ValueError(
                    f"{name} must be positive, got {getattr(self, name)!r}"
                )
        for name in ("workspace", "context", "nccl"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        for name in ("alpha_node", "beta_node", "alpha_network", "beta_network"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if isinstance(self.gpus_per_node, bool) or not (
            isinstance(self.gpus_per_node, int) and self.gpus_per_node >= 1
        ):
            raise ValueError(
                f"gpus_per_node must be an integer >= 1, got {self.gpus_per_node!r}"
            )
        if self.arch not in ARCHES:
            raise ValueError(
                f"arch must be one of {', '.join(ARCHES)}, got {self.arch!r}"
            )

    def rate(self, dtype: str) -> float:
        """FLOP/s a step's matmuls reach in `dtype` ("fp32" or "bf16"): the peak x
        that dtype's efficiency."""
        if dtype == "fp32":
            return self.flops_fp32 * self.efficiency_fp32
        return self.flops_bf16 * self.efficiency_bf16

    def peak(self, dtype: str) -> float:
        """The datasheet's peak FLOP/s in `dtype` (what MFU divides by)."""
        return self.flops_fp32 if dtype == "fp32" else self.flops_bf16

    @property
    def streamed(self) -> float:
        """Bytes/s element-wise kernels move: bandwidth x efficiency_memory."""
        return self.bandwidth * self.efficiency_memory

    def link(self, where: str) -> tuple[float, float]:
        """(alpha, beta) of 'node' or 'network'."""
        if where == "network":
            return self.alpha_network, self.beta_network
        return self.alpha_node, self.beta_node

    def precision(self, policy: DTypePolicy) -> Precision:
        """`policy` on this hardware's device: the bytes of each tensor it keeps."""
        if self.arch == "cpu":
            return Precision(policy.dtype, "cpu")
        capability = (int(self.arch[2:-1]), int(self.arch[-1]))
        return Precision(policy.dtype, "cuda", capability)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Hardware:
        return from_plain(cls, data)


def _datasheet(
    name: str,
    flops: tuple[float, float],
    bandwidth_tbs: float,
    memory_mib: int,
    links: tuple[float, float],
    arch: str,
    url: str,
) -> Hardware:
    """A GPU from its datasheet: (fp32, bf16) TFLOP/s, TB/s, MiB, (NVLink, NIC)
    GB/s, its compute capability."""
    cublas = 32 * MIB if arch == "sm90" else 4096 * 1024 * 2 + 16 * 1024 * 8
    return Hardware(
        name=name,
        flops_fp32=flops[0] * 1e12,
        flops_bf16=flops[1] * 1e12,
        efficiency_fp32=0.8,
        efficiency_bf16=0.65,
        bandwidth=bandwidth_tbs * 1e12,
        efficiency_memory=0.8,
        memory=memory_mib * MIB,
        workspace=2 * cublas,
        context=512 * MIB,
        nccl=512 * MIB,
        gpus_per_node=8,
        alpha_node=5e-6,
        beta_node=1 / (links[0] / 2 * GB),
        alpha_network=10e-6,
        beta_network=1 / (links[1] * GB),
        arch=arch,
        source=url,
    )


GPUS: dict[str, Hardware] = {
    "h100": _datasheet(
        "H100 SXM",
        (67, 989.5),
        3.35,
        81559,
        (900, 50),
        "sm90",
        "https://www.nvidia.com/en-us/data-center/h100/",
    ),
    "h200": _datasheet(
        "H200 SXM",
        (67, 989.5),
        4.8,
        143771,
        (900, 50),
        "sm90",
        "https://www.nvidia.com/en-us/data-center/h200/",
    ),
    "a100": _datasheet(
        "A100 SXM 80GB",
        (19.5, 312),
        2.039,
        81920,
        (600, 25),
        "sm80",
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
    bandwidth: float = 1e10,
    arch: str = "cpu",
) -> Hardware:
    """The reader's machine: `ranks` ranks in one node, measured alpha, beta,
    matmul rate and (`copy_rate`) memory bandwidth (10 GB/s if not given); `arch`
    whose attention kernels they run (`arch_of` their device: "cpu" for CPU ranks,
    "sm90" on an H100/H200 or the emulated GPU, whose fused kernels keep their
    random-number state)."""
    return Hardware(
        name=name,
        flops_fp32=flops,
        flops_bf16=flops,
        efficiency_fp32=1.0,
        efficiency_bf16=1.0,
        bandwidth=bandwidth,
        efficiency_memory=1.0,
        memory=memory,
        workspace=0,
        context=0,
        nccl=0,
        gpus_per_node=ranks,
        alpha_node=alpha,
        beta_node=beta,
        alpha_network=alpha,
        beta_network=beta,
        arch=arch,
        source="measured: comm.costmodel fit, plan.hardware.matmul_rate, copy_rate",
    )


def arch_of(device: torch.device | str) -> str:
    """`Hardware.arch` for ranks on `device`: "cpu", or "sm<major><minor>" of the
    GPU's compute capability (`dtypes.rules_for`: a CUDA GPU's own, 9.0 for the
    emulated one, which chooses attention kernels as an H100/H200 does)."""
    kind, (major, minor) = rules_for(device)
    return "cpu" if kind == "cpu" else f"sm{major}{minor}"


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


def copy_rate(
    elements: int = 2**22, repeats: int = 10, device: torch.device | str = "cpu"
) -> float:
    """Bytes/s an element-wise op moves on `device`: a copy of `elements` fp32
    values reads and writes 8 bytes each; the median of `repeats` after one
    warm-up, timed on the device."""
    a = torch.randn(elements, device=device)
    b = torch.empty_like(a)
    b.copy_(a)
    times = [clock.timed(lambda: b.copy_(a), a.device) for _ in range(repeats)]
    return 8 * elements / sorted(times)[repeats // 2]
