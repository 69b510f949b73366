"""Mixed precision on real gloo ranks: the bytes held are 2 + 2 + 4 + 8 a parameter
(4 + 4 + 8 in fp32, 2 + 2 + 4 in bf16 without a master), the bf16 loss curve
follows fp32's, 2 fp32 ranks equal one process, and a bf16 all_reduce loses digits
where fp32's does not."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from spawned import on_ranks

from distcourse.examples.gpt import TinyGPT, lm_loss, token_batches
from distcourse.parallel.precision import (
    BF16,
    FP32,
    MixedPrecision,
    held_formula,
    reduction_error,
)
from distcourse.parallel.tensor import saved_activation_bytes

STEPS, BATCH = 12, 4


def _train(policy: MixedPrecision, batches: list) -> list[float]:
    return [
        policy.step(lambda model, x=x, y=y: lm_loss(model(x), y)) for x, y in batches
    ]


def _model() -> TinyGPT:
    torch.manual_seed(0)
    return TinyGPT()


def _on_ranks() -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    batches = token_batches(STEPS, BATCH * world)
    mine = [(x.chunk(world)[rank], y.chunk(world)[rank]) for x, y in batches]
    out = {}
    for name, param, reduce, master in (
        ("fp32", FP32, FP32, True),
        ("bf16", BF16, FP32, True),
        ("bf16 reduced in bf16", BF16, BF16, True),
        ("bf16 without master", BF16, FP32, False),
    ):
        model = _model()
        numel = sum(p.numel() for p in model.parameters())
        tensors = len(list(model.parameters()))
        policy = MixedPrecision(
            model, 3e-3, param_dtype=param, reduce_dtype=reduce, master=master
        )
        losses = _train(policy, mine)
        curve = torch.tensor(losses)
        dist.all_reduce(curve)
        out[name] = dict(
            held=policy.held(),
            formula=held_formula(numel, tensors, param, master),
            curve=(curve / world).tolist(),
            state={k: v.float() for k, v in model.state_dict().items()},
        )
    small = torch.full((256,), 1e-3) * (1 + torch.rand(256))
    values = small + (1.0 if rank == 0 else 0.0)
    out["errors"] = {d: reduction_error(values, d) for d in (FP32, BF16)}
    return out


ranks = on_ranks(_on_ranks, 2, timeout=40)


def test_bytes_held_are_2_2_4_8_in_bf16_and_4_4_8_in_fp32(ranks: list[dict]) -> None:
    for out in ranks:
        for name in ("fp32", "bf16", "bf16 reduced in bf16", "bf16 without master"):
            assert out[name]["held"] == out[name]["formula"], name
    fp32, bf16 = ranks[0]["fp32"]["held"], ranks[0]["bf16"]["held"]
    assert sum(fp32.values()) == sum(bf16.values())  # 16 bytes a parameter both


def test_two_fp32_ranks_train_to_one_process(ranks: list[dict]) -> None:
    model = _model()
    one = MixedPrecision(model, 3e-3, param_dtype=FP32)
    curve = _train(one, token_batches(STEPS, BATCH * 2))
    assert ranks[0]["fp32"]["curve"] == pytest.approx(curve, abs=1e-5)
    # AdamW divides by sqrt(v): rounding in a tiny gradient moves a weight by 1e-4
    for key, value in model.state_dict().items():
        torch.testing.assert_close(
            ranks[1]["fp32"]["state"][key], value, atol=1e-3, rtol=0
        )


def test_bf16_curves_follow_fp32(ranks: list[dict]) -> None:
    fp32 = torch.tensor(ranks[0]["fp32"]["curve"])
    for name in ("bf16", "bf16 reduced in bf16"):
        assert (torch.tensor(ranks[0][name]["curve"]) - fp32).abs().max() < 0.02


def test_a_bf16_all_reduce_loses_digits(ranks: list[dict]) -> None:
    errors = ranks[0]["errors"]
    assert errors[FP32] < 1e-6 < 2**-9 < errors[BF16]


def test_bad_input_is_refused_before_any_message() -> None:
    with pytest.raises(ValueError, match="must hold float32 weights"):
        MixedPrecision(TinyGPT().to(BF16))
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        MixedPrecision(TinyGPT(), reduce_dtype=torch.float16)


def test_autocast_over_fp32_weights_keeps_a_bf16_copy_of_each_for_backward() -> None:
    # what the module docstring says of torch's everyday form
    layer, x = torch.nn.Sequential(torch.nn.Linear(64, 64)), torch.randn(8, 64)
    x.requires_grad_()
    with torch.autocast("cpu", dtype=BF16):
        kept = sum(saved_activation_bytes(layer, x).values())
    assert kept == 2 * 64 * 64 + 2 * 8 * 64  # the weight's bf16 copy and the input
