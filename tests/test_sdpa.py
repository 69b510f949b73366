"""distcourse.sdpa: the kernel torch's SDPA runs and what it keeps for backward.

The CPU's choice is held to torch's own answer (`aten._fused_sdp_choice`), the
CUDA kernels' saved tensors to torch's autograd formulas run on meta tensors (their
shape functions, no GPU needed), the CPU kernels' to a real run, and the CUDA
choice to what one H200 ran (torch 2.11.0+cu130, 2026-12-04, tests/data/
gpu_traces/h200-autocast-trace-2026-12-04.json and the GPU suite's block memory).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from distcourse import sdpa

F32, BF16 = torch.float32, torch.bfloat16
ALL = frozenset(sdpa.KERNELS)

# (dtype, head size) -> kernel on an H100/H200 (sm90): the table the module derives
H200 = {
    (F32, 2): "math",  # efficient needs a head size divisible by 4 in fp32
    (F32, 8): "efficient",
    (F32, 64): "efficient",
    (BF16, 2): "flash",  # cuDNN needs a multiple of 8; flash takes any size <= 256
    (BF16, 8): "cudnn",  # measured: TinyGPT's attention under bf16 autocast
    (BF16, 64): "cudnn",
}


@pytest.mark.parametrize(("dtype", "head"), sorted(H200, key=str))
def test_cuda_choice_on_sm90(dtype: torch.dtype, head: int) -> None:
    got = sdpa.choose_kernel("cuda", dtype, head, causal=True, enabled=ALL)
    assert got == H200[dtype, head]


def test_cuda_choice_follows_the_rules() -> None:
    choose = sdpa.choose_kernel
    # without cuDNN's priority (sm80: the context's default order) flash comes first
    assert choose("cuda", BF16, 8, capability=(8, 0), enabled=ALL) == "flash"
    assert choose("cuda", BF16, 8, mask=True, enabled=ALL) == "cudnn"
    assert choose("cuda", BF16, 2, mask=True, enabled=ALL) == "math"  # no flash
    no_cudnn = ALL - {"cudnn"}
    assert choose("cuda", BF16, 8, mask=True, enabled=no_cudnn) == "efficient"
    assert choose("cuda", BF16, 8, dropout=0.1, enabled=ALL) == "flash"  # not k/16
    assert choose("cuda", BF16, 8, dropout=0.125, enabled=ALL) == "cudnn"
    assert choose("cuda", BF16, 8, gqa=True, enabled=ALL) == "cudnn"
    assert choose("cuda", BF16, 256, enabled=ALL) == "flash"  # over cuDNN's 128
    assert choose("cuda", BF16, 264, enabled=ALL) == "efficient"  # over flash's 256
    assert choose("cuda", BF16, 8, seq_k=1, enabled=ALL) == "flash"
    assert choose("cuda", BF16, 8, causal=True, seq_q=4, seq_k=8, enabled=ALL) == (
        "cudnn"
    )
    assert choose("cuda", BF16, 8, causal=True, seq_q=4, seq_k=8, enabled=no_cudnn) == (
        "efficient"  # flash refuses a causal mask on unequal lengths
    )
    assert choose("cuda", BF16, 8, capability=(7, 5), enabled=ALL) == "math"
    assert choose("cuda", torch.float16, 8, capability=(7, 5), enabled=ALL) == (
        "efficient"
    )
    assert choose("cuda", F32, 2, capability=(7, 5), enabled=ALL) == "efficient"
    assert choose("cuda", BF16, 208, capability=(8, 6), enabled=ALL) == "efficient"
    assert choose("cuda", BF16, 208, capability=(8, 6), requires_grad=False) in (
        "flash",
        "math",  # whatever the switches of this process allow
    )
    assert choose("cuda", F32, 64, enabled=frozenset({"math"})) == "math"
    with pytest.raises(RuntimeError, match="No available kernel"):
        choose("cuda", F32, 2, enabled=frozenset({"flash"}))
    with pytest.raises(ValueError, match="no rules for device type"):
        choose("mps", F32, 8)


def test_cuda_choice_follows_torch_switches() -> None:
    with sdpa_kernel(SDPBackend.MATH):
        assert sdpa.choose_kernel("cuda", BF16, 8) == "math"
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
        assert sdpa.choose_kernel("cuda", BF16, 8) == "efficient"


def test_cudnn_priority_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_CUDNN_SDPA_DEPRIORITIZED", "1")
    assert sdpa.choose_kernel("cuda", BF16, 8, enabled=ALL) == "flash"


_CHOICE = {int(SDPBackend.FLASH_ATTENTION): "cpu_flash", int(SDPBackend.MATH): "math"}


@pytest.mark.parametrize("dtype", [F32, BF16, torch.float64, torch.float16])
@pytest.mark.parametrize("head", [2, 8, 64])
def test_cpu_choice_is_torchs(dtype: torch.dtype, head: int) -> None:
    q = torch.randn(2, 4, 16, head, dtype=dtype)
    kv = torch.randn(2, 2, 16, head, dtype=dtype)
    mask = torch.ones(16, 16, dtype=torch.bool)
    cases = [  # (q, k, v, mask, dropout, gqa)
        (q, q, q, None, 0.0, False),
        (q, q, q, mask, 0.0, False),
        (q, q, q, None, 0.25, False),
        (q, kv, kv, None, 0.0, True),
    ]
    every = [SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]
    for backends in (every, [SDPBackend.MATH]):
        with sdpa_kernel(backends):
            for query, key, value, m, p, gqa in cases:
                choice = torch.ops.aten._fused_sdp_choice(
                    query, key, value, m, p, False, enable_gqa=gqa
                )
                mine = sdpa.choose_kernel(
                    "cpu", dtype, head, mask=m is not None, dropout=p, gqa=gqa
                )
                assert mine == _CHOICE[choice], (backends, m is not None, p, gqa)


def _kept_apart(run, q, k, v) -> tuple[list[torch.Tensor], torch.Tensor]:
    """What autograd keeps during `run(q, k, v)` other than q, k, v and the
    output, and the output."""
    seen: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = run(q, k, v)
    first = out[0] if isinstance(out, tuple) else out
    mine = {id(q), id(k), id(v), id(first)}
    return [t for t in seen if id(t) not in mine], first


_META_OPS = {  # CUDA's kernels, called on meta tensors: torch's shape functions
    "cudnn": lambda q, k, v: torch.ops.aten._scaled_dot_product_cudnn_attention(
        q, k, v, None, True, 0.0, True, False
    ),
    "flash": lambda q, k, v: torch.ops.aten._scaled_dot_product_flash_attention(
        q, k, v, 0.0, True, False
    ),
    "efficient": lambda q, k, v: torch.ops.aten._scaled_dot_product_efficient_attention(
        q, k, v, None, True, 0.0, True
    ),
}


@pytest.mark.parametrize("kernel", sorted(_META_OPS))
@pytest.mark.parametrize("seq", [8, 40, 64])
def test_cuda_kernels_keep_what_torchs_formulas_keep(kernel: str, seq: int) -> None:
    dtype = F32 if kernel == "efficient" else BF16
    b, h, d = 2, 4, 8
    q, k, v = (
        torch.empty(b, h, seq, d, device="meta", dtype=dtype, requires_grad=True)
        for _ in range(3)
    )
    kept, _ = _kept_apart(_META_OPS[kernel], q, k, v)
    names = ("lse", "seed", "offset")
    got = {n: t.untyped_storage().nbytes() for n, t in zip(names, kept, strict=True)}
    assert got == sdpa.saved_bytes(kernel, b, h, seq, d, dtype)
    assert kept[0].dtype == F32


def _storages_kept(run, *inputs) -> int:
    """Bytes of the distinct storages autograd keeps during `run(*inputs)`."""
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run(*inputs)
    return sum(kept.values())


@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("head", [2, 8, 64])
def test_cpu_kernels_keep_what_they_say(dtype: torch.dtype, head: int) -> None:
    """A fused kernel keeps q, k, v, its output and its entries; the math path
    keeps q, k, v (as scaled or float32 copies: "upcast") and its entries."""
    b, h, s = 2, 3, 8
    q, k, v = (
        torch.randn(b, h, s, head, dtype=dtype, requires_grad=True) for _ in "qkv"
    )
    each = q.untyped_storage().nbytes()

    def attention(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    fused = sdpa.saved_bytes("cpu_flash", b, h, s, head, dtype)
    assert _storages_kept(attention, q, k, v) == 4 * each + sum(fused.values())
    with sdpa_kernel(SDPBackend.MATH):
        kept = _storages_kept(attention, q, k, v)
    assert kept == 3 * each + sum(
        sdpa.saved_bytes("math", b, h, s, head, dtype).values()
    )


def test_the_gpu_suites_block_ran_the_math_path() -> None:
    """tests/gpu/test_gpu_tensor.py's block (width 16, 8 heads, batch 2, 8 tokens,
    fp32) kept 9216 bytes on the H200: its 5 activations of width 16 per token and
    the math path's scores; the fused formula said 7184 (memory-efficient's lse)."""
    b, s, width, heads = 2, 8, 16, 8
    kernel = sdpa.choose_kernel("cuda", F32, width // heads, causal=True, enabled=ALL)
    per_token = b * s * 5 * width * 4
    kept = sdpa.saved_bytes(kernel, b, heads, s, width // heads, F32)
    assert (kernel, per_token + sum(kept.values())) == ("math", 9216)
    fused = sdpa.saved_bytes("efficient", b, heads, s, width // heads, F32)
    assert per_token + sum(fused.values()) == 7184


def test_bad_kernel_and_head_size_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown kernel"):
        sdpa.saved_bytes("fast", 1, 1, 1, 1, F32)
    with pytest.raises(ValueError, match="head_dim must be positive"):
        sdpa.choose_kernel("cuda", F32, 0)


def test_the_math_path_keeps_the_h200s_9216_bytes_on_the_cpu() -> None:
    """The math path is one composite on every device: forced on the CPU, the GPU
    suite's block keeps in attention what the H200 measured."""
    from distcourse.examples.gpt import Block, GPTConfig
    from distcourse.parallel.tensor.memory import saved_activation_bytes

    torch.manual_seed(0)
    block = Block(GPTConfig(n_embd=16, n_head=8))
    x = torch.randn(2, 8, 16, requires_grad=True)
    with sdpa_kernel(SDPBackend.MATH):
        assert saved_activation_bytes(block, x)["attn"] == 9216
    assert saved_activation_bytes(block, x)["attn"] == 5120 + 2 * 8 * 8 * 4  # lse
