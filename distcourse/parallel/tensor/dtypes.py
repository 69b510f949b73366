"""What each tensor of a training step weighs under a dtype policy, on a device.

A dtype policy is not one number of bytes a value: under `torch.autocast` a
transformer keeps tensors of two dtypes for backward (measured on one H200, torch
2.11.0+cu130, 2026-12-04: TinyGPT's saved activations under bf16 autocast were
0.82 of fp32's, not 0.5), and torch's kernels differ by device (a layer norm's
statistics, the attention kernel's log-sum-exp, the loss's log-softmax). So the
formulas (`memory.block_activation_bytes`, `plan.memory`, `plan.timing`) ask a
`Precision` the bytes of the very tensor they count.

Policies (the planner's `--dtype`):

    fp32      fp32 weights, fp32 compute
    bf16      bf16 weights (an fp32 master beside them), bf16 compute without
              autocast, as Megatron-LM runs it: layer norms write bf16 (their
              statistics fp32 on CUDA, bf16 on the CPU), the loss casts the logits
              to fp32 first (Megatron's cross-entropy does)
    amp-bf16  fp32 weights under torch.autocast(bfloat16) (nanoGPT's, torchtitan's
              with FSDP's param_dtype aside): matmuls in bf16, the residual stream
              and the layer norms in fp32 (CUDA's autocast runs layer_norm in fp32,
              and its input is fp32), and each Linear casts its input and its weight
              to bf16 and keeps the casts (q, k and v cast the same input three
              times); cross_entropy passes the logits' dtype to log_softmax, so on
              CUDA the log-softmax runs in bf16 and nll_loss (autocast's fp32 list)
              keeps an fp32 copy of it; the CPU's autocast casts the logits to fp32
              before the log-softmax instead

Bytes of each tensor (CUDA; the CPU's differences after the slash):

    tensor        what it is                                   fp32  bf16  amp-bf16
    residual      the stream between blocks, a norm's input,     4     2     4
                  a stage's output, a checkpointed block's input
    stats         a layer norm's mean and 1/std, each            4    4/2    4
    norm_out      what a layer norm writes                       4     2     4
    input         what a Linear keeps of its input               4     2     2
    value         matmul outputs, q, k, v, attention's output,   4     2     2
                  GELU's input and output, the logits
    weight_copy   a Linear's weight cast kept for backward       0     0     2
    log_probs     the loss's kept log-probabilities, per logit   4     4    6/4
    loss_extra    the loss region at its worst beyond them       8     8    4/8
    loss_traffic  bytes the loss's non-matmul ops move forward,  8    14   10/14
                  per logit

`input_copies`: 3 under autocast (q, k and v each keep a cast of the same input),
1 otherwise. The loss region (`loss_extra`, per logit): fp32, the logits while the
log-softmax is written (4), then in backward the log-probabilities' gradient and the
logits' gradient (4 + 4) beside the kept log-probabilities; bf16 and the CPU's
amp-bf16, the fp32 copy of the logits and its gradient (the cast's backward); CUDA's
amp-bf16, nll_loss's fp32 gradient beside both kept copies, the largest moment.
`loss_traffic` counts a log-softmax's read and write and each cast's (forward;
backward is taken as twice it).

The attention kernel's own keep (beyond q, k, v and the output) is the kernel torch
picks for the matmul dtype and head size on this device (`distcourse.sdpa`: causal
self-attention, no mask, no dropout, every kernel enabled unless `live`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from distcourse import accelerator, sdpa

POLICIES = ("fp32", "bf16", "amp-bf16")
DEVICES = ("cuda", "cpu")
TENSORS = (
    "residual",
    "stats",
    "norm_out",
    "input",
    "value",
    "weight_copy",
    "log_probs",
    "loss_extra",
    "loss_traffic",
)
_BYTES = {  # policy -> bytes of each of TENSORS, on CUDA
    "fp32": (4, 4, 4, 4, 4, 0, 4, 8, 8),
    "bf16": (2, 4, 2, 2, 2, 0, 4, 8, 14),
    "amp-bf16": (4, 4, 4, 2, 2, 2, 6, 4, 10),
}
_CPU = {  # what differs on the CPU
    "bf16": dict(stats=2),
    "amp-bf16": dict(log_probs=4, loss_extra=8, loss_traffic=14),
}


@dataclass(frozen=True)
class Precision:
    """A dtype policy on a device: `nbytes(tensor)` for each of TENSORS, and what
    the attention kernel keeps (`attention`). `capability` is the GPU's compute
    capability (an H100's and H200's 9.0), unused on the CPU."""

    policy: str = "fp32"
    device: str = "cuda"
    capability: tuple[int, int] = (9, 0)

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(
                f"dtype policy must be one of {', '.join(POLICIES)}, got "
                f"{self.policy!r}"
            )
        if self.device not in DEVICES:
            raise ValueError(
                f"device must be one of {', '.join(DEVICES)}, got {self.device!r}"
            )

    def nbytes(self, tensor: str) -> int:
        """Bytes of one element of `tensor` (TENSORS; the table above)."""
        table = _table(self.policy, self.device)
        if tensor not in table:
            raise ValueError(f"unknown tensor {tensor!r}; one of {', '.join(TENSORS)}")
        return table[tensor]

    @property
    def casts(self) -> bool:
        """Autocast: each Linear casts (and keeps) its input and its weight."""
        return self.policy == "amp-bf16"

    @property
    def input_copies(self) -> int:
        """Copies of the norm's output that q, k and v keep: one each under
        autocast, one shared otherwise."""
        return 3 if self.casts else 1

    @property
    def matmul_dtype(self) -> torch.dtype:
        """The dtype matmuls and attention run in."""
        return torch.float32 if self.policy == "fp32" else torch.bfloat16

    def kernel(self, head_dim: int, live: bool = False) -> str:
        """The attention kernel torch runs for causal self-attention of `head_dim`
        (`sdpa.choose_kernel`); `live`: under torch's switches now (a run under
        `sdpa_kernel(...)`), else with every kernel enabled (torch's default)."""
        if not live:
            return _default_kernel(self, head_dim)
        return _causal_kernel(self, head_dim, enabled=None)

    def attention(
        self, batch: int, heads: int, seq: int, head_dim: int, live: bool = False
    ) -> int:
        """Bytes the attention kernel keeps beyond q, k, v and its output, for
        `heads` heads of `seq` tokens (`sdpa.saved_bytes` of `kernel`)."""
        kernel = self.kernel(head_dim, live)
        kept = sdpa.saved_bytes(kernel, batch, heads, seq, head_dim, self.matmul_dtype)
        return sum(kept.values())


@functools.cache
def _table(policy: str, device: str) -> dict[str, int]:
    table = dict(zip(TENSORS, _BYTES[policy], strict=True))
    return table | (_CPU.get(policy, {}) if device == "cpu" else {})


@functools.lru_cache(maxsize=1024)
def _default_kernel(precision: Precision, head_dim: int) -> str:
    """The kernel with every kernel enabled (what a plan assumes), remembered."""
    return _causal_kernel(precision, head_dim, enabled=frozenset(sdpa.KERNELS))


def _causal_kernel(
    precision: Precision, head_dim: int, enabled: frozenset[str] | None
) -> str:
    """`sdpa.choose_kernel` for causal self-attention in this precision, among the
    kernels `enabled` (None: torch's switches now)."""
    return sdpa.choose_kernel(
        precision.device,
        precision.matmul_dtype,
        head_dim,
        causal=True,
        capability=precision.capability,
        enabled=enabled,
    )


def rules_for(device: torch.device | str) -> tuple[str, tuple[int, int]]:
    """(the kernel rules, the compute capability) a device's attention follows:
    any GPU CUDA's (`accelerator.kernel_type`: the emulated one chooses as CUDA
    does), a CUDA GPU at its own capability (9.0, an H100's, where no GPU is here
    to ask), any other device the CPU's."""
    kind = accelerator.kernel_type(device)
    if kind not in DEVICES:
        return "cpu", (9, 0)
    if accelerator.is_cuda(device) and torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability(torch.device(device))
        return kind, (major, minor)
    return kind, (9, 0)


def precision_of(x: torch.Tensor) -> Precision:
    """The precision a forward on `x` runs under here: amp-bf16 inside a bf16
    autocast of x's device type, else fp32 or bf16 by x's dtype."""
    kind, capability = rules_for(x.device)
    if torch.is_autocast_enabled(x.device.type):
        if torch.get_autocast_dtype(x.device.type) != torch.bfloat16:
            raise ValueError("only bf16 autocast is modelled (amp-bf16)")
        return Precision("amp-bf16", kind, capability)
    policies = {torch.float32: "fp32", torch.bfloat16: "bf16"}
    if x.dtype not in policies:
        raise ValueError(f"no dtype policy for {x.dtype}: fp32, bf16 or amp-bf16")
    return Precision(policies[x.dtype], kind, capability)
