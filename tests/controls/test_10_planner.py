"""Negative controls of chapter 10: its own cells (activation bytes measured with
saved-tensor hooks against `layer_activation_bytes`; `MixedPrecision.held` against
`held_formula`, loss curves against fp32's, step 1's gradient against one process,
`reduction_error` against its tolerance; the planner against the published tables,
FSDP's C/W rule, the H200's measured steps, one step's memory over time, and the
bytes and peaks of runs on these ranks), run with a fault planted, must turn each
verdict they print from PASS to FAIL.

The faults are planted in the code under test (the tensor-parallel block, the
checkpointing policy, the activation formula's masks, MixedPrecision's optimizer,
master and all-reduce, reduction_error's dtype, torch's selective checkpoint, the
planner's policy, kinds, loss region and collectives, the runs' ZeRO-1) or in what
the chapter's own lines run (a block with dropout measured, every token given to
sequence parallelism, the fused kernel where the math one is asked for, the token
ids as a slice), never in a comparison. One spawn of the chapter's 4 ranks runs
them (tests/controls/harness.py); the lines as written are the stored notebook's.
To keep the file as quick as the chapter, the bytes held run one training step,
not 60 (AdamW's state is whole after the first), step 1's gradient runs without
the 60-step trainings before it, and the measured cells (the costliest) run once
with their three faults, each read by its own verdict only.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import harness
import torch
import torch.distributed as dist
from harness import Code, Fault, Plant, Swap
from torch import nn

from distcourse import plan
from distcourse.parallel import checkpointing, precision, tensor, zero
from distcourse.parallel.ddp import DDP
from distcourse.plan import measure
from distcourse.plan import memory as plan_memory
from distcourse.plan import timing as plan_timing

CHAPTER = harness.Chapter(
    "10_planner",
    setup=["B, T, H, A = 4, 32, 64, 4  # batch"],
    here="import torch\nfrom IPython.display import display\n"
    "from distcourse import checks, plan, tables, viz\n"
    "from distcourse.examples.gpt import Block, GPTConfig, TinyGPT\n"
    "from distcourse.parallel import checkpointing as ckpt\n",
    stored=True,
    timeout=180,
)
KEPT = ["def kept(name, twin", 'kept("one process", block)', 'kept("one process, sel']
TRAINED = ["def train(param, reduce, master)", "RUNS = {  # weights"]
ONE_STEP = Code("%%ranks\nmine = mine[:1]  # one step: AdamW's state exists, whole")
HELD = [TRAINED[0], ONE_STEP, TRAINED[1]]  # the bytes held, not the 60 steps
CURVES = [*TRAINED, 'fp32 = torch.tensor(CURVES["fp32"])']
RUNS = Code(  # the four precisions of cell "RUNS = {", without their 60 steps
    "%%ranks\nRUNS = {\n"
    '    "fp32": (FP32, FP32, True),\n'
    '    "bf16, reduced in fp32": (BF16, FP32, True),\n'
    '    "bf16, reduced in bf16": (BF16, BF16, True),\n'
    '    "bf16, no master": (BF16, FP32, False),\n'
    "}\n"
)
STEP_1 = [TRAINED[0], RUNS, "one = TinyGPT().to(device)  # one process"]
H100 = Code('H100 = plan.named("h100")')
MEASURED = [
    "sizes, times = [2**k for k in",
    "ddp = DistributedDataParallel(model, gradient_as_bucket_view=True)",
    'stream = ranks.pull("STREAM", 0)',
    "RUNS = {name: measure.run(name, CFG, batches)",
    'MiB, runs = 2**20, [ranks.pull("RUNS", r)',
    "every rank's wire and activation bytes == the plan's",
]
H200_ROWS = [  # the plan of every H200 row: its row, the table, the verdicts
    "def plan_row(r, spec, p, ratio)",
    "rows.append(plan_row(r, spec, p, ratio))",
    "every H200 row's peak",
]


def mlp_left_whole(real: Callable) -> Callable:
    """parallelize_block whose MLP stays whole: only attention is split."""

    def faulty(block: nn.Module, *args: Any, **kwargs: Any) -> nn.Module:
        split = real(block, *args, **kwargs)
        split.mlp = block.mlp
        return split

    return faulty


def not_applied(block: nn.Module, policy: str) -> nn.Module:
    """with_policy that leaves the block as it is: the policy never applied."""
    return block


class AmsgradPrecision(precision.MixedPrecision):
    """AdamW with amsgrad: a third moment the formula does not count."""

    def __init__(self, model: nn.Module, lr: float, *args: Any, **kw: Any) -> None:
        super().__init__(model, lr, *args, **kw)
        self.optimizer = torch.optim.AdamW(self.master, lr=lr, amsgrad=True)


class InvertedPrecision(precision.MixedPrecision):
    """`master` read backwards: bf16 weights stepped by AdamW with no fp32 master
    where one is asked for, and an fp32 master kept where none is."""

    def __init__(self, model: nn.Module, lr: float, *args: Any, **kw: Any) -> None:
        super().__init__(model, lr, *args, **{**kw, "master": not kw["master"]})


class SummedPrecision(precision.MixedPrecision):
    """Gradients summed over the ranks: the mean multiplied back by the world."""

    def step(self, loss_of: Callable) -> float:
        loss = super().step(loss_of)
        for p in self.params:
            p.grad *= dist.get_world_size()
        return loss


class LocalPrecision(precision.MixedPrecision):
    """No all-reduce at all: each rank keeps its own quarter's gradient."""

    def __init__(self, model: nn.Module, lr: float, *args: Any, **kw: Any) -> None:
        super().__init__(model, lr, dist.new_group([dist.get_rank()]), **kw)


def other_dtype(real: Callable) -> Callable:
    """reduction_error whose all-reduce runs in the other dtype than the one asked:
    bf16 where fp32 is asked, fp32 where bf16 is."""
    other = {torch.float32: torch.bfloat16, torch.bfloat16: torch.float32}

    def reduction_error(values: torch.Tensor, dtype: torch.dtype, *args: Any) -> float:
        return real(values, other[dtype], *args)

    return reduction_error


def masks_as_values(real: Callable) -> Callable:
    """The activation formula counting each dropout mask at a value's bytes (its
    `mask_bytes` ignored): 2 a mask in the paper's bf16, where the paper has 1."""

    def formula(*args: Any, **kw: Any) -> dict[str, int]:
        if kw.get("mask_bytes"):
            kw["mask_bytes"] = kw.get("value_bytes", 4)
        return real(*args, **kw)

    return formula


def redrawn(real: type) -> Callable:
    """torch's selective checkpoint without its RNG state: dropout drawn again."""
    return functools.partial(real, preserve_rng_state=False)


class MasterlessPolicy(plan.DTypePolicy):
    """A policy whose optimizer keeps no fp32 master: 8 bytes of state, not 12."""

    @property
    def optimizer_bytes(self) -> int:
        return 8


def amp_as_bf16(real: type) -> Callable:
    """bf16 autocast planned as the bf16 policy: one byte count a value."""
    return lambda dtype, *args: real("bf16" if dtype == "amp-bf16" else dtype, *args)


def no_loss_region(*args: Any) -> int:
    """The planner's loss region (the logits and their gradients) left out."""
    return 0


def zero1_as_torch(real: Callable) -> Callable:
    """ZeRO-1 built as torch's ZeroRedundancyOptimizer runs it: DDP's all-reduce,
    then a broadcast of each parameter from its owner (3 Psi; the plan charges 2)."""

    def build(name: str, cfg: Any) -> tuple:
        if name != "ZeRO-1":
            return real(name, cfg)
        from distcourse import runtime
        from distcourse.examples.gpt import TinyGPT

        model = TinyGPT(cfg).to(runtime.device())
        opt = zero.ZeroRedundancyOptimizer(
            model.parameters(), torch.optim.AdamW, lr=1e-3
        )
        return DDP(model, bucket_cap_mb=measure.BUCKET_MB), opt

    return build


GATHER_ONCE = (  # ZeRO-3 without its backward all-gather
    ("all_gather", "weight", "micro", "forward"),
    ("reduce_scatter", "grad", "micro", "backward"),
)
UNHIDDEN = {  # every data-parallel message after compute, none behind it
    stage: tuple((*call[:3], "none") for call in calls)
    for stage, calls in plan_timing.DP_COLLECTIVES.items()
}
FAULTS = {
    "dropout kept": Fault(
        KEPT,
        Swap(
            'kept("one process", block)',
            'kept("one process", Block(GPTConfig(n_embd=H, n_head=A, block_size=T, '
            "dropout=0.1)).to(device))",
        ),
    ),
    "MLP whole": Fault(
        KEPT, Plant(tensor, "parallelize_block", mlp_left_whole, wrap=True)
    ),
    "every token": Fault(
        KEPT,
        Swap(
            "    mine = x.tensor_split(t, 1)[rank] if sp else x  # SP: this rank's "
            "tokens",
            "    mine = x",
        ),
    ),
    "policy not applied": Fault(KEPT, Plant(checkpointing, "with_policy", not_applied)),
    "fused kernel": Fault(
        KEPT,
        Swap(
            "with sdpa_kernel(SDPBackend.MATH):  # the scores kept: the paper's as "
            "term",
            "if True:",
        ),
    ),
    "amsgrad": Fault(HELD, Plant(precision, "MixedPrecision", AmsgradPrecision)),
    "master inverted": Fault(
        CURVES, Plant(precision, "MixedPrecision", InvertedPrecision)
    ),
    "summed": Fault(STEP_1, Plant(precision, "MixedPrecision", SummedPrecision)),
    "never reduced": Fault(STEP_1, Plant(precision, "MixedPrecision", LocalPrecision)),
    "sums in the other dtype": Fault(
        ["def train(param, reduce, master)", "eps = torch.full((1000,), 1e-3)"],
        Plant(precision, "reduction_error", other_dtype, wrap=True),
    ),
    "masks as values": Fault(
        ["PAPER = dict("],
        Plant(tensor, "layer_activation_bytes", masks_as_values, wrap=True),
    ),
    "dropout redrawn": Fault(
        ["def kept_and_grads(", "none, want = kept_and_grads(drop)"],
        Plant(checkpointing, "TorchSelective", redrawn, wrap=True),
    ),
    "masterless policy": Fault(
        ["zero_paper = {0: 120.0", "playbook = {1: (16, 20)"],
        Plant(plan, "DTypePolicy", MasterlessPolicy),
    ),
    "ZeRO-3 gathers once": Fault(
        [H100, "C/W rule"],
        Plant(
            plan_timing,
            "DP_COLLECTIVES",
            {**plan_timing.DP_COLLECTIVES, 3: GATHER_ONCE},
        ),
    ),
    "nothing overlapped": Fault(
        [H100, "C/W rule"],
        Plant(plan_timing, "DP_COLLECTIVES", UNHIDDEN),
        Plant(plan_timing, "KEPT", tuple((*c[:3], "none") for c in plan_timing.KEPT)),
    ),
    "no loss region": Fault(
        [
            "ROWS = json.loads(",
            *H200_ROWS,
            "MiB, FUSED = 2**20, plan.DTypePolicy",
        ],
        Plant(plan_memory, "loss_bytes", no_loss_region),
    ),
    "autocast as bf16": Fault(
        ["ROWS = json.loads(", *H200_ROWS],
        Plant(plan, "DTypePolicy", amp_as_bf16, wrap=True),
    ),
    # three faults in one run of the measured cells (the costliest): each verdict
    # reads its own and only its own (run one by one, each failed its verdict and
    # left the other two passing)
    "slice, torch's ZeRO-1, no optimizer": Fault(
        MEASURED,
        Swap(
            "data = [(x.chunk(world_size)[rank].contiguous().to(device),",
            "data = [(x.chunk(world_size)[rank].to(device),",
        ),
        Plant(measure, "build", zero1_as_torch, wrap=True),
        Plant(
            plan_memory,
            "KINDS",
            tuple(k for k in plan_memory.KINDS if k != "optimizer"),
        ),
    ),
}


CONTROLS = harness.Controls(
    "10_planner",
    test_a_block_with_dropout_is_not_the_formula=harness.Flip(
        ["dropout kept"],
        r"one process\s+[\d,]+ bytes; == formula on every rank",
        "a block with dropout 0.1 (its masks kept) against the formula without",
    ),
    test_a_block_whose_mlp_is_whole_is_not_the_formula=harness.Flip(
        ["MLP whole"],
        r"TP=\d+\s+[\d,]+ bytes; == formula on every rank",
        "a tensor-parallel block whose MLP was left whole",
    ),
    test_sequence_parallelism_on_every_token_is_not_the_formula=harness.Flip(
        ["every token"],
        r"TP=\d+ \+ SP\s+[\d,]+ bytes; == formula on every rank",
        "sequence parallelism run on every token, not the rank's part",
        r"TP=\d+ \+ SP, full\s+[\d,]+ bytes; == formula",
        "a checkpointed sequence-parallel block given every token",
    ),
    test_checkpointing_not_applied_fails=harness.Flip(
        ["policy not applied"],
        r"one process, (selective|full)\s+[\d,]+ bytes; == formula",
        "the checkpointing policy not applied (the block runs plainly)",
        r"scores kept, selective\s+[\d,]+ bytes; == formula",
        "selective recompute not applied under the math kernel",
    ),
    test_the_fused_kernel_keeps_no_scores=harness.Flip(
        ["fused kernel"],
        r"scores kept\s+[\d,]+ bytes; == formula",
        "the fused kernel run where the math kernel (scores kept) was asked for",
    ),
    test_bytes_held_with_a_third_moment_fail=harness.Flip(
        ["amsgrad"],
        r"bytes a parameter; by kind == formula",
        "AdamW with amsgrad: a third moment in the optimizer state",
    ),
    test_bf16_without_master_strays_from_fp32=harness.Flip(
        ["master inverted"],
        r"bf16, reduced in (fp32|bf16): max \|loss - fp32's\|",
        "MixedPrecision's master read backwards: bf16 stepped without an fp32 master "
        "where one is asked for",
    ),
    test_a_run_with_a_master_does_not_stray=harness.Flip(
        ["master inverted"],
        r"bf16, no master: strays from fp32",
        "MixedPrecision's master read backwards: an fp32 master kept where none is "
        "asked for",
    ),
    test_a_summed_or_missing_all_reduce_fails_the_step_1_gradient=harness.Flip(
        ["summed", "never reduced"],
        r"step-1 gradient vs one process, relative to its norm",
        "bf16 gradients summed over the ranks (4x the mean), or never all-reduced",
        each=True,
    ),
    test_reductions_in_the_other_dtype_fail=harness.Flip(
        ["sums in the other dtype"],
        r"all_reduce in fp32: max relative error",
        "reduction_error's all-reduce run in bf16 where fp32 is asked",
        r"all_reduce in bf16: .*digits lost",
        "reduction_error's all-reduce run in fp32 where bf16 is asked",
    ),
    test_the_papers_count_with_wider_masks_fails=harness.Flip(
        ["masks as values"],
        r"= sbh\(34 \+ 5as/h\), with TP=8 and TP=8 \+ SP too",
        "the formula counting a dropout mask at a value's bytes (2, not 1)",
    ),
    test_a_recompute_that_redraws_dropout_fails=harness.Flip(
        ["dropout redrawn"],
        r"gradients vs no checkpointing, max \|diff\|",
        "torch's selective checkpoint, preserve_rng_state=False (dropout redrawn)",
    ),
    test_the_published_tables_without_a_master_fail=harness.Flip(
        ["masterless policy"],
        r"per-GPU model state = the ZeRO paper's Figure 1",
        "a bf16 policy without fp32 master weights (8 bytes of optimizer state)",
        r"= the Ultra-Scale Playbook's table",
        "a bf16 policy without fp32 master weights (8 bytes of optimizer state)",
    ),
    test_a_zero3_that_gathers_once_misses_the_rule=harness.Flip(
        ["ZeRO-3 gathers once"],
        r"planner vs the rule, relative",
        "a planner whose ZeRO-3 all-gathers the weights once a step, not twice",
    ),
    test_a_plan_that_overlaps_nothing_does_not_pick_fsdp=harness.Flip(
        ["nothing overlapped"],
        r"fastest is FSDP alone: \w+, its messages hidden",
        "a planner that overlaps no data-parallel message with compute",
    ),
    test_a_plan_without_the_loss_region_misses_the_peaks=harness.Flip(
        ["no loss region"],
        r"every H200 row's peak vs the plan's total, relative",
        "a planner without the loss region (the logits and their gradients)",
        r"each kind's largest and the peak == the planner's",
        "a planner without the loss region",
    ),
    test_autocast_planned_as_bf16_misses_its_activations=harness.Flip(
        ["autocast as bf16"],
        r"every H200 row's saved activations vs the plan's, relative",
        "bf16 autocast planned as one byte count a value (the bf16 policy)",
    ),
    test_a_slice_and_torchs_zero1_differ_from_the_plan=harness.Flip(
        ["slice, torch's ZeRO-1, no optimizer"],
        r"rank 0's bytes by kind == plan.predict's",
        "the token ids passed as a slice of a longer tensor (its storage counted)",
        r"every rank's wire and activation bytes == the plan's",
        "ZeRO-1 run as torch's ZeroRedundancyOptimizer (all-reduce + broadcast, 3Ψ)",
    ),
    test_a_plan_without_optimizer_state_misses_the_peak=harness.Flip(
        ["slice, torch's ZeRO-1, no optimizer"],
        r"every rank's peak vs the plan's total, relative",
        "a planner whose total leaves out the optimizer state",
    ),
)
globals().update(CONTROLS.tests())
