"""Negative controls for chapter 10's measured sections: torch's selective
checkpointing beside ours, the planner against the C/W rule for FSDP, and six
layouts' peak and wire bytes against the plan. Each runs the chapter's check on a
planted fault and must print FAIL or False."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from distcourse import checks, plan, runtime
from distcourse.allocations import PeakMemory
from distcourse.examples.gpt import Block, GPTConfig, TinyGPT, token_batches
from distcourse.launch import spawn
from distcourse.parallel import zero
from distcourse.parallel.checkpointing import MATMUL_OPS, TorchSelective
from distcourse.parallel.ddp import DDP
from distcourse.plan import measure
from distcourse.plan import memory as plan_memory
from distcourse.plan import timing as plan_timing

CFG = GPTConfig(vocab=256, block_size=64, n_layer=4, n_head=4, n_embd=128)


def _fails(line: str) -> bool:
    return line.endswith(("FAIL", ": False"))


def _grads(block: Block, net: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The chapter's `kept_and_grads`, gradients only: dropout seeded alike."""
    torch.manual_seed(1)
    with PeakMemory("cpu", held=[x]):
        out = net(x)
    out.square().sum().backward()
    grads = torch.cat([p.grad.flatten() for p in block.parameters()])
    block.zero_grad()
    return grads


@pytest.mark.controls(
    "10_planner",
    r"gradients vs no checkpointing, max \|diff\|",
    fault="torch's selective checkpoint, preserve_rng_state=False (dropout redrawn)",
)
def test_a_recompute_that_redraws_dropout_fails() -> None:
    torch.manual_seed(0)
    block = Block(GPTConfig(n_embd=64, n_head=4, block_size=32, dropout=0.1))
    x = torch.randn(4, 32, 64, requires_grad=True)
    want = _grads(block, block, x)
    redrawn = TorchSelective(block, MATMUL_OPS, preserve_rng_state=False)
    worst = (_grads(block, redrawn, x) - want).abs().max().item()
    line = f"gradients vs no checkpointing, max |diff|: {checks.verdict(worst, 1e-6)}"
    assert _fails(line), line


def _zero1_as_torch_runs_it(name: str, cfg: GPTConfig) -> tuple:
    """ZeRO-1 as torch's ZeroRedundancyOptimizer runs it: DDP's all-reduce, then a
    broadcast of each parameter from its owner (3Ψ, where the plan charges 2Ψ)."""
    model = TinyGPT(cfg).to(runtime.device())
    opt = zero.ZeroRedundancyOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3)
    return DDP(model, bucket_cap_mb=measure.BUCKET_MB), opt


def _on_ranks() -> dict[str, dict]:
    torch.set_num_threads(1)
    batches = token_batches(3, 16, CFG)
    out = {"DP": measure.run("DP", CFG, batches)}
    measure.build = _zero1_as_torch_runs_it  # the fault, in this process only
    out["ZeRO-1"] = measure.run("ZeRO-1", CFG, batches)
    dist.barrier()
    return out


@pytest.fixture(scope="module")
def measured() -> list[dict[str, dict]]:
    return spawn(_on_ranks, 4, timeout=60)


@pytest.mark.controls(
    "10_planner",
    r"every rank's peak vs the plan's total, relative",
    fault="a planner whose total leaves out the optimizer state",
)
def test_a_plan_without_optimizer_state_misses_the_peak(
    measured: list[dict[str, dict]], monkeypatch: pytest.MonkeyPatch
) -> None:
    kinds = tuple(k for k in plan_memory.KINDS if k != "optimizer")
    monkeypatch.setattr(plan_memory, "KINDS", kinds)
    here = plan.named("h100")
    worst = 0.0
    for got in measured:
        ratio, _ = measure.compared(got["DP"], measure.predict("DP", CFG, 16, 4, here))
        worst = max(worst, abs(ratio - 1))
    verdict = checks.verdict(worst, 0.1)
    line = f"every rank's peak vs the plan's total, relative: {verdict}"
    assert _fails(line), line


@pytest.mark.controls(
    "10_planner",
    r"every rank's wire and activation bytes == the plan's",
    fault="ZeRO-1 run as torch's ZeroRedundancyOptimizer (all-reduce + broadcast, 3Ψ)",
)
def test_zero1_as_torch_runs_it_sends_more_than_the_plan(
    measured: list[dict[str, dict]],
) -> None:
    planned = measure.predict("ZeRO-1", CFG, 16, 4, plan.named("h100"))
    exact = all(measure.compared(got["ZeRO-1"], planned)[1] for got in measured)
    line = f"every rank's wire and activation bytes == the plan's: {exact}"
    assert _fails(line), line


@pytest.mark.controls(
    "10_planner",
    r"planner vs the rule, relative",
    fault="a planner whose ZeRO-3 all-gathers the weights once a step, not twice",
)
def test_a_zero3_that_gathers_once_misses_the_rule(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    once = (
        ("all_gather", "weight", "micro", "forward"),
        ("reduce_scatter", "grad", "micro", "backward"),
    )
    monkeypatch.setitem(plan_timing.DP_COLLECTIVES, 3, once)
    h100, model = plan.named("h100"), plan.ModelSpec.from_params(7e9, seq=1024)
    all_bf16 = plan.DTypePolicy("bf16", "bf16", "adamw")
    worst = 0.0
    for where, dp in (("node", 8), ("network", 64)):  # the chapter's cell
        rule = (dp - 1) / dp * h100.rate("bf16") * h100.link(where)[1]
        layout = plan.PlanLayout(dp=dp, zero=3)
        p = plan.predict(model, dp, all_bf16, layout, h100)
        meet = model.seq * p.messages["dp"] / p.time["compute"]
        worst = max(worst, abs(meet / rule - 1))
    line = f"planner vs the rule, relative: {checks.verdict(worst, 0.05)}"
    assert _fails(line), line
