"""Negative controls for chapter 10: every verdict the chapter prints, run on a
planted fault, must say FAIL or False. The checks are the chapter's own (the same
package functions and comparisons): activation bytes measured with saved-tensor hooks
against `layer_activation_bytes` (over the ranks), `MixedPrecision.held` against
`held_formula`, loss curves against fp32's, `reduction_error` against its tolerance,
the planner's model state against the published tables, and the bytes of a run
against `plan.predict`. The rank checks run in one spawn of 2 ranks.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from distcourse import checks, plan, runtime
from distcourse.examples.gpt import Block, GPTConfig, TinyGPT, lm_loss, token_batches
from distcourse.launch import spawn
from distcourse.parallel import precision, zero
from distcourse.parallel.checkpointing import with_policy
from distcourse.parallel.tensor import (
    korthikanti_bytes,
    layer_activation_bytes,
    parallelize_block,
    saved_activation_bytes,
    step_activation_bytes,
)

B, T, H, A = 4, 32, 64, 4
BF16, FP32 = torch.bfloat16, torch.float32


def _fails(line: str) -> bool:
    return line.endswith(("FAIL", ": False"))


def _kept(name: str, twin: nn.Module, x: torch.Tensor, t: int = 1, **how) -> str:  # noqa: ANN003
    """The chapter's `kept` check: `x` is what this rank runs on (a fault may pass
    the wrong part); `how` holds sp, policy and scores_kept as the chapter's, and
    `applied`: the policy the block truly runs under (a fault: "none")."""
    sp, policy = how.get("sp", False), how.get("policy", "none")
    run = with_policy(twin, how.get("applied", policy))
    got = saved_activation_bytes(run, x.contiguous())
    kept = how.get("scores_kept", False)
    options = dict(sequence_parallel=sp, scores_kept=kept, recompute=policy)
    options["device_type"] = x.device.type
    want = layer_activation_bytes(B, T, H, A, t, **options)
    same = checks.max_over_ranks(float(sum(got.values()) != sum(want.values()))) == 0
    return f"{name} {sum(got.values()):,} bytes; == formula on every rank: {same}"


def _memory(found: dict[str, str]) -> None:
    n, device = dist.get_world_size(), runtime.device()  # as the chapter: on device
    torch.manual_seed(0)
    block = Block(GPTConfig(n_embd=H, n_head=A, block_size=T)).to(device)
    x = torch.randn(B, T, H).to(device)
    torch.manual_seed(0)
    dropping = Block(GPTConfig(n_embd=H, n_head=A, block_size=T, dropout=0.1))
    dropping.to(device)
    found["one process"] = _kept("one process", dropping, x)
    half = parallelize_block(block)
    half.mlp = block.mlp  # the MLP left whole
    found["TP"] = _kept("TP", half, x, n)
    sp = parallelize_block(block, sequence_parallel=True)
    found["TP + SP"] = _kept("TP + SP", sp, x, n, sp=True)  # every token, not mine
    plain = dict(applied="none")  # the policy not applied
    found["selective"] = _kept("selective", block, x, policy="selective", **plain)
    found["full"] = _kept("full", block, x, policy="full", **plain)
    found["TP + SP, full"] = _kept("TP + SP, full", sp, x, n, sp=True, policy="full")
    found["scores kept"] = _kept("scores kept", block, x, scores_kept=True)  # fused
    with sdpa_kernel(SDPBackend.MATH):
        found["scores kept, selective"] = _kept(
            "scores kept, selective",
            block,
            x,
            scores_kept=True,
            policy="selective",
            **plain,
        )


class AmsgradPrecision(precision.MixedPrecision):
    """AdamW with amsgrad: a third moment the formula does not count."""

    def __init__(self, model: nn.Module, lr: float, **options) -> None:  # noqa: ANN003
        super().__init__(model, lr, **options)
        self.optimizer = torch.optim.AdamW(self.master, lr=lr, amsgrad=True)


class SummedPrecision(precision.MixedPrecision):
    """Gradients summed over the ranks: the mean multiplied back by the world."""

    def step(self, loss_of) -> float:  # noqa: ANN001
        loss = super().step(loss_of)
        for p in self.params:
            p.grad *= dist.get_world_size()
        return loss


class LocalPrecision(precision.MixedPrecision):
    """No all-reduce at all: each rank keeps its own quarter's gradient."""

    def __init__(self, model: nn.Module, lr: float, **options) -> None:  # noqa: ANN003
        super().__init__(model, lr, dist.new_group([dist.get_rank()]), **options)


def _step_one(found: dict[str, str], mine: list) -> None:
    """The chapter's step-1 gradient check, on a sum and on no all-reduce."""
    device = runtime.device()
    torch.manual_seed(0)
    one = TinyGPT().to(device)
    whole = [t.to(device) for t in token_batches(60, 8)[0]]
    lm_loss(one(whole[0]), whole[1]).backward()
    want = torch.cat([p.grad.reshape(-1) for p in one.parameters()])
    for name, cls in (
        ("right", precision.MixedPrecision),
        ("summed", SummedPrecision),
        ("local", LocalPrecision),
    ):
        torch.manual_seed(0)
        model = TinyGPT().to(device)
        mp = cls(model, 3e-3, param_dtype=BF16, master=True)
        mp.step(lambda m: lm_loss(m(mine[0][0]), mine[0][1]))
        got = torch.cat([p.grad.float().reshape(-1) for p in model.parameters()])
        rel = checks.max_over_ranks(((got - want).norm() / want.norm()).item())
        found[f"step-1 {name}"] = (
            f"step-1 gradient vs one process, relative to its norm "
            f"{checks.verdict(rel, 5e-2)}"
        )
        found[f"step-1 {name} value"] = f"{rel:.4f}"


def _curve(mp: precision.MixedPrecision, mine: list) -> list[float]:
    curve = torch.tensor(
        [mp.step(lambda m, x=x, y=y: lm_loss(m(x), y)) for x, y in mine],
        device=runtime.device(),
    )
    dist.all_reduce(curve)
    return (curve / dist.get_world_size()).tolist()


def _precision(found: dict[str, str]) -> None:
    n, rank, device = dist.get_world_size(), dist.get_rank(), runtime.device()
    mine = [
        tuple(t.chunk(n)[rank].to(device) for t in batch)
        for batch in token_batches(60, 8)
    ]
    _step_one(found, mine)
    shapes = [p.numel() for p in TinyGPT().parameters()]
    numel, tensors = sum(shapes), len(shapes)
    curves = {}
    runs = (("fp32", FP32, True), ("no master", BF16, False), ("master", BF16, True))
    for name, param, master in runs:
        torch.manual_seed(0)
        model = TinyGPT().to(device)
        mp = AmsgradPrecision(model, 3e-3, param_dtype=param, master=master)
        _curve(mp, mine[:1])  # one step: the state exists
        same = mp.held() == precision.held_formula(numel, tensors, param, master)
        found[f"held {name}"] = f"{name} bytes a parameter; by kind == formula: {same}"
        torch.manual_seed(0)
        model = TinyGPT().to(device)
        mp = precision.MixedPrecision(model, 3e-3, param_dtype=param, master=master)
        curves[name] = torch.tensor(_curve(mp, mine))
    gap = (curves["no master"] - curves["fp32"]).abs().max().item()
    found["curve"] = f"bf16: max |loss - fp32's| {checks.verdict(gap, 2e-2)}"
    gap = (curves["master"] - curves["fp32"]).abs().max().item()  # has a master
    found["strays"] = f"bf16, no master: strays by more than 2e-02: {gap > 2e-2}"
    torch.manual_seed(1)
    eps = torch.full((1000,), 1e-3) * (1 + torch.rand(1000))
    values = (eps + (1.0 if rank == 0 else 0.0)).to(device)
    err = precision.reduction_error(values, BF16)  # the "fp32" sum run in bf16
    found["fp32 sum"] = f"all_reduce in fp32: {checks.verdict(err, 1e-6)}"
    err = precision.reduction_error(values, FP32)  # the "bf16" sum run in fp32
    found["bf16 sum"] = f"all_reduce in bf16: (digits lost): {err > 2**-9}"


def _all_faults() -> dict[str, str]:
    torch.set_num_threads(1)
    found: dict[str, str] = {}
    _memory(found)
    _precision(found)
    return found


@pytest.fixture(scope="module")
def faults() -> dict[str, str]:
    """What rank 0 printed for each planted fault (one spawn for the chapter)."""
    return spawn(_all_faults, 2, timeout=60)[0]


@pytest.mark.controls(
    "10_planner",
    r"one process\s+[\d,]+ bytes; == formula on every rank",
    fault="a block with dropout 0.1 (its masks kept) against the formula without",
)
@pytest.mark.controls(
    "10_planner",
    r"TP=\d+\s+[\d,]+ bytes; == formula on every rank",
    fault="a tensor-parallel block whose MLP was left whole",
)
@pytest.mark.controls(
    "10_planner",
    r"TP=\d+ \+ SP\s+[\d,]+ bytes; == formula on every rank",
    fault="sequence parallelism run on every token, not the rank's part",
)
@pytest.mark.controls(
    "10_planner",
    r"TP=\d+ \+ SP, full\s+[\d,]+ bytes; == formula",
    fault="a checkpointed sequence-parallel block given every token",
)
def test_activation_bytes_of_broken_layouts_fail(faults: dict[str, str]) -> None:
    for name in ("one process", "TP", "TP + SP", "TP + SP, full"):
        assert _fails(faults[name]), faults[name]


@pytest.mark.controls(
    "10_planner",
    r"one process, (selective|full)\s+[\d,]+ bytes; == formula",
    fault="the checkpointing policy not applied (the block runs plainly)",
)
@pytest.mark.controls(
    "10_planner",
    r"scores kept, selective\s+[\d,]+ bytes; == formula",
    fault="selective recompute not applied under the math kernel",
)
@pytest.mark.controls(
    "10_planner",
    r"scores kept\s+[\d,]+ bytes; == formula",
    fault="the fused kernel run where the math kernel (scores kept) was asked for",
)
def test_checkpointing_not_applied_fails(faults: dict[str, str]) -> None:
    for name in ("selective", "full", "scores kept", "scores kept, selective"):
        assert _fails(faults[name]), faults[name]


@pytest.mark.controls(
    "10_planner",
    r"bytes a parameter; by kind == formula",
    fault="AdamW with amsgrad: a third moment in the optimizer state",
)
def test_bytes_held_with_a_third_moment_fail(faults: dict[str, str]) -> None:
    for name in ("fp32", "no master", "master"):
        assert _fails(faults[f"held {name}"]), faults[f"held {name}"]


@pytest.mark.controls(
    "10_planner",
    r"bf16, reduced in (fp32|bf16): max \|loss - fp32's\|",
    fault="bf16 weights stepped by AdamW without an fp32 master",
)
def test_bf16_without_master_strays_from_fp32(faults: dict[str, str]) -> None:
    assert _fails(faults["curve"]), faults["curve"]


@pytest.mark.controls(
    "10_planner",
    r"bf16, no master: strays from fp32",
    fault="the run labelled 'no master' given an fp32 master",
)
def test_a_run_with_a_master_does_not_stray(faults: dict[str, str]) -> None:
    assert _fails(faults["strays"]), faults["strays"]


@pytest.mark.controls(
    "10_planner",
    r"all_reduce in fp32: max relative error",
    fault="the sum run in bf16",
)
@pytest.mark.controls(
    "10_planner",
    r"all_reduce in bf16: .*digits lost",
    fault="the sum run in fp32",
)
def test_reductions_in_the_other_dtype_fail(faults: dict[str, str]) -> None:
    for name in ("fp32 sum", "bf16 sum"):
        assert _fails(faults[name]), faults[name]


@pytest.mark.controls(
    "10_planner",
    r"= sbh\(34 \+ 5as/h\), with TP=8 and TP=8 \+ SP too",
    fault="the paper's switches with 2-byte dropout masks",
)
def test_the_papers_count_with_wider_masks_fails() -> None:
    paper = dict(value_bytes=2, mask_bytes=2, scores_kept=True, norm_stats=False)
    b, s, h, a = 1, 2048, 12288, 96
    same = []
    for t, sp in ((1, False), (8, False), (8, True)):
        ours = layer_activation_bytes(
            b, s, h, a, t, sequence_parallel=sp, keep_gathered=False, **paper
        )
        same.append(sum(ours.values()) == korthikanti_bytes(b, s, h, a, t, sp))
    assert not all(same)


class NoMaster(plan.DTypePolicy):
    """bf16 whose optimizer keeps no fp32 master: 8 bytes of state, not 12."""

    @property
    def optimizer_bytes(self) -> int:
        return 8


def _gb(policy: plan.DTypePolicy, zero_stage: int, psi: int, n: int, buf: int = 0):  # noqa: ANN202
    state = plan.model_state(policy, zero_stage, psi, -(-psi // n), 0)
    return round((sum(state.values()) + buf * psi) / 1e9, 1)


@pytest.mark.controls(
    "10_planner",
    r"per-GPU model state = the ZeRO paper's Figure 1",
    fault="a bf16 policy without fp32 master weights (8 bytes of optimizer state)",
)
@pytest.mark.controls(
    "10_planner",
    r"= the Ultra-Scale Playbook's table",
    fault="a bf16 policy without fp32 master weights (8 bytes of optimizer state)",
)
def test_the_published_tables_without_a_master_fail() -> None:
    bf16 = NoMaster("bf16", "fp32", "adamw")
    zero_paper = {0: 120.0, 1: 31.4, 2: 16.6, 3: 1.9}
    assert {z: _gb(bf16, z, 7_500_000_000, 64) for z in range(4)} != zero_paper
    playbook = {1: (16, 20), 7: (112, 140), 70: (1120, 1400), 405: (6480, 8100)}
    fp32 = plan.DTypePolicy("fp32", "fp32", "adamw")
    mine = {
        g: (_gb(fp32, 0, g * 10**9, 1), _gb(bf16, 0, g * 10**9, 1, bf16.reduce_bytes))
        for g in playbook
    }
    assert mine != playbook


@pytest.mark.controls(
    "10_planner",
    r"rank 0's bytes by kind == plan.predict's",
    fault="the token ids passed as a slice of a longer tensor (its storage counted)",
)
def test_a_run_measured_on_a_slice_differs_from_the_plan() -> None:
    cfg = GPTConfig(vocab=256, block_size=64, n_layer=4, n_head=4, n_embd=128)
    torch.manual_seed(0)
    model = TinyGPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = token_batches(1, 16, cfg)[0]
    x, y = x[:4], y[:4]  # rank 0's quarter, still a view of the (16, 65) tokens
    lm_loss(model(x), y).backward()
    opt.step()
    held = zero.held(model.parameters(), opt)
    held["activations"] = step_activation_bytes(model, lambda m: lm_loss(m(x), y))
    layout = plan.PlanLayout(dp=4, bucket_view=True)
    fp32 = plan.DTypePolicy("fp32", "fp32", "adamw")
    spec = plan.ModelSpec.from_config(cfg)
    p = plan.predict(spec, 16, fp32, layout, plan.named("h100"))
    same = (
        all(p.memory[kind] == held[kind] for kind in held) and p.memory["buffers"] == 0
    )
    assert not same


@pytest.mark.controls(
    "10_planner",
    r"step-1 gradient vs one process, relative to its norm",
    fault="bf16 gradients summed over the ranks (4x the mean), or never all-reduced",
)
def test_a_summed_or_missing_all_reduce_fails_the_step_1_gradient(
    faults: dict[str, str],
) -> None:
    assert faults["step-1 right"].endswith("PASS"), faults["step-1 right value"]
    assert float(faults["step-1 right value"]) < 2e-2  # bf16's rounding, with room
    for name in ("summed", "local"):
        assert _fails(faults[f"step-1 {name}"]), faults[f"step-1 {name} value"]
