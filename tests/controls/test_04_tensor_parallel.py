"""Negative controls of chapter 4: its own cells, run with a fault planted in the
tensor-parallel package (or the model it splits), must turn each verdict they print
from PASS to FAIL.

The faults: the row layer's g skipped (no all_reduce forward); a column layer that
keeps the next rank's rows; sequence parallelism's g as an all_reduce, its f issued
twice, its norm's weight used without f (its gradient one rank's tokens' only); every
MLP keeping a mask of its output for backward (more activation memory than the
formula); every gradient doubled from the loss on (the bug AdamW hides, shown below);
and the split model of the two-device cell nudged. One spawn of the chapter's 4
ranks runs them all (tests/controls/harness.py); the lines as written are the stored
notebook's (its cells take a while, and nbval checks them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import harness
import torch
import torch.distributed as dist
import torch.nn.functional as F
from harness import Fault, Plant
from torch import Tensor

from distcourse import accelerator
from distcourse.examples import gpt, models
from distcourse.parallel import tensor
from distcourse.parallel.tensor import blocks, edges

CHAPTER = harness.Chapter(
    "04_tensor_parallel", setup=['mesh = Mesh((2, 2), ("pair", "tp"))'], stored=True
)
LAYERS = "column holds W["  # the cells, by a text of each
TWINS = ["class WithoutF(ParallelMLP)", "twins = {"]
VOCAB = "p_emb = VocabParallelEmbedding.from_embedding(emb)"
BYTES = "recorded all_reduces"
SP_BYTES = "sp_mlp = ParallelMLP.from_module(mlp, sequence_parallel=True)"
MEMORY = "from distcourse.parallel.tensor import block_memory"
DTENSOR = ['plan = {"fc": ColwiseParallel()', "sp_plan = {", "vocab_plan = {"]
TRAINING = "tp2, tp4 = parallelize_gpt(gpt, pair), parallelize_gpt(gpt)"
CHECKPOINT = ["save_checkpoint(tp2, path, pair)", "probe = token_batches(1, 2"]
SGD = "TP=4 step-1 gradients vs one process"


def no_g(x: Tensor, group: Any) -> Tensor:
    """Megatron's g skipped: each rank keeps its partial sum."""
    return x


def next_ranks_rows(load: Callable) -> Callable:
    """A column layer that keeps the next rank's rows of a full state dict."""

    def faulty(self: tensor.ColumnParallelLinear, state: dict) -> None:
        step = -state["weight"].shape[0] // self.tp.size  # one rank's rows
        load(self, {k: torch.roll(v, step, 0) for k, v in state.items()})

    return faulty


def g_as_all_reduce(x: Tensor, dim: int, group: Any) -> Tensor:
    """Sequence parallelism's g as an all_reduce, then this rank's tokens: the right
    numbers, twice the bytes, no reduce_scatter."""
    n, r = dist.get_world_size(group), dist.get_rank(group)
    return edges.g(x, group).tensor_split(n, dim)[r]


def gathered_twice(gather: Callable) -> Callable:
    """Sequence parallelism's f issued twice, the second kept: the same numbers."""

    def faulty(x: Tensor, dim: int, group: Any, sizes: Any) -> Tensor:
        gather(x, dim, group, sizes)
        return gather(x, dim, group, sizes)

    return faulty


def local_norm(self: blocks.SequenceParallelLayerNorm, x: Tensor) -> Tensor:
    """The sequence-parallel norm's weight and bias used without f: their gradient
    holds only this rank's tokens."""
    return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


def masked(forward: Callable) -> Callable:
    """An MLP that multiplies its output by a mask of ones (a dropout of p = 0
    written out), which autograd keeps for backward: more activation memory."""

    def faulty(self: torch.nn.Module, x: Tensor) -> Tensor:
        out = forward(self, x)
        return out * torch.ones_like(out)

    return faulty


class DoubledGradient(torch.autograd.Function):
    """The loss unchanged, its gradient doubled: a sum where a mean belongs."""

    @staticmethod
    def forward(ctx: Any, loss: Tensor) -> Tensor:
        return loss.view_as(loss)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        return 2 * grad


def doubled(loss_fn: Callable) -> Callable:
    return lambda *args, **kwargs: DoubledGradient.apply(loss_fn(*args, **kwargs))


def two_local_gpus(n: int, preference: Any = None) -> list[str]:
    """The two-device cell's check made to run on this machine: two "GPUs"."""
    return ["cpu", "cpu"]


def nudged_net2(init: Callable) -> Callable:
    """The two-device model with net2's bias (one value) nudged by 1e-3."""

    def faulty(self: models.TwoDeviceToyModel, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        with torch.no_grad():
            self.net2.bias.view(-1)[0] += 1e-3

    return faulty


ALL = [LAYERS, *TWINS, VOCAB, BYTES, *DTENSOR, TRAINING, *CHECKPOINT]
FAULTS = {
    "no g": Fault(ALL, Plant(edges, "g", no_g)),
    "next rank's rows": Fault(
        [LAYERS, TWINS[0], VOCAB, TRAINING, *CHECKPOINT],
        Plant(
            tensor.ColumnParallelLinear, "load_full_state_dict", next_ranks_rows, True
        ),
    ),
    "SP g as all_reduce": Fault(
        [*TWINS, BYTES, SP_BYTES], Plant(edges, "scatter_sequence", g_as_all_reduce)
    ),
    "SP f twice": Fault(
        [*TWINS, BYTES, SP_BYTES],
        Plant(edges, "gather_sequence", gathered_twice, wrap=True),
    ),
    "SP norm without f": Fault(
        [*TWINS, VOCAB, *DTENSOR[:2]],
        Plant(blocks.SequenceParallelLayerNorm, "forward", local_norm),
    ),
    "masked MLP": Fault(
        [*TWINS, BYTES, MEMORY],
        Plant(gpt.MLP, "forward", masked, wrap=True),
        Plant(tensor.ParallelMLP, "forward", masked, wrap=True),
    ),
    "doubled gradients": Fault(
        [TWINS[0], VOCAB, TRAINING, SGD],
        Plant(tensor, "vocab_parallel_cross_entropy", doubled, wrap=True),
    ),
    "two devices, nudged": Fault(
        ["split = models.TwoDeviceToyModel(first, second)"],
        Plant(accelerator, "local_gpus", two_local_gpus),
        Plant(models.TwoDeviceToyModel, "__init__", nudged_net2, wrap=True),
    ),
}


CONTROLS = harness.Controls(
    "04_tensor_parallel",
    test_two_devices_with_a_nudged_layer_fail=harness.Flip(
        ["two devices, nudged"],
        r"max \|two devices - one device\|",
        "net2 of the two-device model (one value) nudged by 1e-3",
        printed_on="2 GPUs",
    ),
    test_layers_with_the_wrong_rows_or_without_g_fail=harness.Flip(
        ["next rank's rows", "no g"],
        r"column == my columns of Y .*; row == Y",
        "a column layer holding the next rank's rows; a row layer without g",
        each=True,
    ),
    test_row_layers_without_g_fail=harness.Flip(
        ["no g"],
        r"(MLP|attention|block)\s+output, input grad, \d+ parameter grads",
        "the row layers' g skipped (no all_reduce forward)",
        r"loss and both gradients",
        "the row layers' g skipped: the embedding's sum never made",
        r"(MLP|block): on the wire .* as the shapes say",
        "the row layers' g skipped: one all_reduce of two missing",
        r"MLP, output and 4 gradients",
        "our row layer's g skipped, torch's plan right",
        r"loss_parallel [\d.]+; loss and gradients",
        "our embedding's g skipped, torch's plan right",
        r"TP=\d: .*every loss",
        "the row layers' g skipped while training the split TinyGPT",
        r"logits on 1 == the saved TP=2 model's",
        "the row layers' g skipped: the split models' logits are partial sums",
    ),
    test_a_checkpoint_loaded_into_the_wrong_rows_fails=harness.Flip(
        ["next rank's rows"],
        r"every parameter equal to the saved one",
        "a column layer loading the next rank's rows of the checkpoint",
    ),
    test_sequence_parallel_g_as_an_all_reduce_fails_the_bytes=harness.Flip(
        ["SP g as all_reduce"],
        r"reduce_scatters \(g\) sent",
        "sequence parallelism whose g is an all_reduce, not a reduce_scatter",
    ),
    test_sequence_parallel_f_twice_fails_the_count=harness.Flip(
        ["SP f twice"],
        r"all_gathers \(f\): \d+, each handed my S/N",
        "sequence parallelism's f issued twice (the same numbers)",
    ),
    test_a_sequence_parallel_norm_without_f_fails=harness.Flip(
        ["SP norm without f"],
        r"block, seq\. parallel\s+output, input grad",
        "the sequence-parallel norm's weight used without f (its gradient one rank's "
        "tokens' only)",
        r"sequence-parallel block, output and \d+ gradients",
        "our sequence-parallel norm's weight used without f, torch's plan right",
    ),
    test_an_mlp_that_keeps_more_fails_the_memory_formula=harness.Flip(
        ["masked MLP"],
        r"(one process|TP=\d+|TP=\d+ \+ SP) .*== formula on every rank",
        "every MLP keeping a mask of its output for backward",
    ),
    test_doubled_gradients_fail_the_gradient_and_sgd_checks=harness.Flip(
        ["doubled gradients"],
        r"TP=4 step-1 gradients vs one process",
        "every gradient of the split TinyGPT doubled (a sum where a mean belongs)",
        r"TP=4 with SGD: .*every loss",
        "every gradient of the split TinyGPT doubled (a sum where a mean belongs)",
    ),
)
globals().update(CONTROLS.tests())


def test_adamw_cannot_see_doubled_gradients(ran: harness.Ran) -> None:
    """Why the chapter adds step 1's gradients and SGD: AdamW's step m / sqrt(v)
    loses the factor, and its training matches one process all the same."""
    harness.assert_holds(ran, "doubled gradients", r"TP=\d: .*every loss")
