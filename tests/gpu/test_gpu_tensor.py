"""Tensor parallelism on the suite's device: the column and row parallel linears and
the MLP block (with and without sequence parallelism), split over every world size the
box allows, equal one process on the same device: the output, the input's gradient
and every parameter's gradient (parallel.tensor.differences, relative to the values);
and a block's activation memory, measured with saved-tensor hooks on the device, equal
to the formula (whose CUDA attention term is read from torch's shape functions)."""

from __future__ import annotations

import itertools

import torch
from gpu_suite import TOL, run
from torch import nn

from distcourse import runtime
from distcourse.examples.gpt import MLP, Block, GPTConfig
from distcourse.parallel.tensor import (
    ColumnParallelLinear,
    ParallelMLP,
    RowParallelLinear,
    block_memory,
    differences,
    parallelize_block,
)

B, T, H = 2, 8, 16  # T and n_head (8) divide into 1, 2, 4 or 8 pieces


def _against_one_process() -> dict[str, float]:
    device = runtime.device()
    torch.manual_seed(0)  # the same modules and input on every rank
    pair = nn.Sequential(nn.Linear(H, 24), nn.GELU(), nn.Linear(24, 8))
    column, row = pair[0], pair[2]
    mlp = MLP(H)
    cases = {  # name: (one process, its parallel twin, sequence parallel)
        "column, row": (
            pair,
            nn.Sequential(
                ColumnParallelLinear.from_linear(column),
                nn.GELU(),
                RowParallelLinear.from_linear(row),
            ),
            False,
        ),
        "column gathered": (
            nn.Sequential(column),
            nn.Sequential(ColumnParallelLinear.from_linear(column, gather_output=True)),
            False,
        ),
        "mlp": (mlp, ParallelMLP.from_module(mlp), False),
        "mlp sequence-parallel": (
            mlp,
            ParallelMLP.from_module(mlp, sequence_parallel=True),
            True,
        ),
    }
    x = torch.randn(B, T, H).to(device)
    found = {}
    for name, (module, twin, sp) in cases.items():
        module, twin = module.to(device), twin.to(device)
        assert all(p.device == device for p in twin.parameters())
        got = differences(module, twin, x, sequence_parallel=sp)
        found.update({f"{name}: {k}": v for k, v in got.items()})
    return found


def test_tensor_parallel_layers_and_mlp_equal_one_process(world: int) -> None:
    for rank, found in enumerate(run(_against_one_process, world)):
        assert len(found) >= 18 and max(found.values()) <= TOL, (rank, found)


# (width, heads): head sizes 2, 8 and 64, 16 heads (two or more a rank at every
# world size: with one head the flash kernel's padded output needs no copy);
# fp32; bf16 (bf16 weights and values: CUDA keeps a norm's statistics in fp32);
# bf16 attention under autocast (fp32 weights)
SHAPES = ((32, 16), (128, 16), (1024, 16))
POLICIES = ("fp32", "bf16", "amp-bf16")
CASES = list(itertools.product(SHAPES, POLICIES))


def _block_memory() -> list[tuple[str, dict[str, int], dict[str, int]]]:
    device = runtime.device()
    found = []
    for (width, heads), policy in CASES:
        torch.manual_seed(0)
        dtype = torch.bfloat16 if policy == "bf16" else torch.float32
        block = Block(GPTConfig(n_embd=width, n_head=heads)).to(device, dtype)
        x = torch.randn(B, T, width).to(device, dtype)
        case = f"head {width // heads} {policy}"
        with torch.autocast(device.type, torch.bfloat16, enabled=policy == "amp-bf16"):
            found.append((case, *block_memory(block, block, x)))
            for sp in (False, True):
                twin = parallelize_block(block, sequence_parallel=sp)
                measured, formula = block_memory(block, twin, x, sequence_parallel=sp)
                found.append((f"{case} TP, sp {sp}", measured, formula))
    return found


def test_block_activation_memory_equals_the_formula(world: int) -> None:
    for rank, cases in enumerate(run(_block_memory, world)):
        assert len(cases) == 3 * len(CASES)
        wrong = [c for c in cases if c[1] != c[2]]
        assert not wrong, (rank, wrong)
