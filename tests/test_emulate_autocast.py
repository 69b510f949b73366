"""CUDA's autocast policy on the emulated GPU (distcourse/emulate/autocast.py), read
from the installed torch's ATen/autocast_mode.h: softmax and layer_norm of bf16
inputs return float32 as on CUDA, binary_cross_entropy is refused as CUDA refuses
it (with its negative control: the same program done right passes)."""

from __future__ import annotations

import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from distcourse import emulate, torchcompat
from distcourse.emulate import autocast, kernels

emulate.setup()
GPU = torch.device(emulate.DEVICE_TYPE, 0)
BF16 = torch.bfloat16


def test_the_policy_is_read_from_torchs_header() -> None:
    policy = autocast.read_policy()
    assert ("softmax", "int") in policy["fp32_set_opt_dtype"]
    assert ("layer_norm", "default") in policy["fp32"]
    if torchcompat.at_least("2.14"):  # 2.11's header lists no rms_norm
        assert ("rms_norm", "default") in policy["fp32"]
    assert ("mm", "default") in policy["lower_precision_fp"]
    assert ("norm", "Scalar") in policy["fp32_append_dtype"]
    assert kernels.MISSING == []  # every entry names an op of this torch
    names = {name for pairs in policy.values() for name, _ in pairs}
    assert "binary_cross_entropy" not in names  # banned apart (autocast_mode.cpp)


def test_a_missing_list_is_an_error(tmp_path) -> None:
    header = tmp_path / "autocast_mode.h"
    header.write_text("#define AT_FORALL_FP32(_) \\\n  _(exp)\n")
    with pytest.raises(RuntimeError, match="AT_FORALL_LOWER_PRECISION_FP"):
        autocast.read_policy(header)


def test_bf16_inputs_come_out_as_cuda_makes_them() -> None:
    x = torch.randn(4, 8).to(GPU).to(BF16)
    norm = nn.LayerNorm(8).to(GPU)
    with torch.autocast(emulate.DEVICE_TYPE, BF16):
        assert torch.softmax(x, -1).dtype == torch.float32
        assert F.log_softmax(x, -1).dtype == torch.float32
        assert F.log_softmax(x, -1, dtype=BF16).dtype == BF16  # a dtype given
        assert norm(x).dtype == torch.float32
        assert x.sum().dtype == torch.float32
        assert torch.cumsum(x, 0).dtype == torch.float32
        assert (x @ x.T).dtype == BF16
        assert torch.mm(x.float(), x.float().T).dtype == BF16
        assert torch.exp(x).dtype == torch.float32
        assert torch.norm(x).dtype == torch.float32
        assert torch.addcmul(x, x.float(), x).dtype == torch.float32  # promote
        assert torch.relu(x).dtype == BF16  # not listed: its input's dtype
        logits = torch.randn(4, 5).to(GPU)
        target = torch.tensor([0, 1, 2, 3]).to(GPU)
        assert F.cross_entropy(logits, target).dtype == torch.float32
    with torch.autocast("cpu", BF16):  # the CPU's own policy differs
        assert torch.softmax(x.cpu(), -1).dtype == BF16


def _loss(fn) -> float:
    start = time.monotonic()
    torch.manual_seed(0)
    probs = torch.rand(4).to(GPU)
    target = torch.ones(4).to(GPU)
    with torch.autocast(emulate.DEVICE_TYPE, BF16):
        fn(probs, target)
    return time.monotonic() - start


def test_binary_cross_entropy_under_autocast_is_refused() -> None:
    with pytest.raises(RuntimeError, match="unsafe to autocast") as refusal:
        _loss(F.binary_cross_entropy)
    assert autocast.RULE_BANNED in str(refusal.value)
    assert _loss(F.binary_cross_entropy_with_logits) < 30  # done right: it runs
    probs = torch.rand(4).to(GPU)
    F.binary_cross_entropy(probs, torch.ones(4).to(GPU))  # outside autocast: runs
