"""Negative controls of chapter 9: its own cells, run with a fault planted in the code
under test (ZeRO's optimizer and its share of the parameters, ShardedDDP's
reduce-scatter, FlatZero, FSDP's units and layout, the checkpoint's loader, the 2-D
trainer's rows), must turn each verdict they print from PASS to FAIL.

One spawn of the chapter's 4 ranks runs them all (tests/controls/harness.py): each
fault on the cells that print its verdicts, beside the same cells as written.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import harness
import torch
from harness import Fault, Plant, Swap
from torch import Tensor

from distcourse import torchcompat
from distcourse.parallel import fsdp, zero
from distcourse.parallel.fsdp import api as fsdp_api
from distcourse.parallel.fsdp import layout
from distcourse.parallel.fsdp import unit as fsdp_unit
from distcourse.parallel.hybrid import fsdp_tp
from distcourse.parallel.zero import flat, partition
from distcourse.parallel.zero import optimizer as zero_optimizer

CHAPTER = harness.Chapter(
    "09_zero_fsdp",
    setup=["REF = {kind"],
    # what cells 25 and 35 import, and cell 26's first line (the torch side's mesh)
    prelude="import torch.nn.functional as F\n"
    "from torch.distributed.device_mesh import DeviceMesh\n"
    "world_mesh = DeviceMesh.from_group(dist.group.WORLD, device.type)\n",
    here="from distcourse import viz",
    stored=True,
)
ZERO_1 = "bytes held by kind = ZeRO-1's formula"  # the cells, by a text of each
ZERO_2 = "wire bytes of a step {sent} = ZeRO-2's formula"
FLAT = "flat ZeRO-{stage}: peak gradient bytes"
FSDP = "bytes held by kind = ZeRO-3's formula"
FSDP_BYTES = "wire bytes of a step {sent} = FSDP's formula"
TORCH = [ZERO_1, FSDP, "def against_ours", 'against_ours("ZeRO-1"']
SEMANTICS = ["def against_ours", "def sharded(", "ONE = {name"]
RESUME = [
    "CKPT, NEVER_STOPPED",
    "dcp.save(state",
    "def load(group",
    "def resume(members",
    "for members in ([0, 1], [0]):",
]
HELD = ["def build(stage", "HELD, SAVED = {}", 'ranks.pull("HELD"']
SAVED = ["def build(stage", "HELD, SAVED = {}", 'ranks.pull("SAVED"']


def never_sent(self: zero.ZeroRedundancyOptimizer) -> None:
    """ZeRO-1's step that never sends the updated share: the others stay stale."""


def round_robin(groups: list[list[Tensor]], world: int) -> list[list[list[Tensor]]]:
    """The share computation, wrong: parameters dealt out in turn, not largest
    first to the rank holding least (torch's rule, and the formula's)."""
    owned: list[list[list[Tensor]]] = [[[] for _ in groups] for _ in range(world)]
    for g, params in enumerate(groups):
        for i, param in enumerate(params):
            owned[i % world][g].append(param)
    return owned


def kept_local(out: Tensor, row: Tensor, group: Any = None, **_: Any) -> Any:
    """A reduce-scatter that adds nothing: each rank keeps its own block."""
    world = torch.distributed.get_world_size(group)
    out.copy_(row.view(world, -1)[torch.distributed.get_rank(group)])


def all_reduced_whole(out: Tensor, row: Tensor, group: Any = None, **_: Any) -> Any:
    """A reduce-scatter done as an all-reduce of the whole row, then sliced: the
    same numbers, twice the bytes."""
    torch.distributed.all_reduce(row, group=group)
    kept_local(out, row, group)


def collectives(reduce_scatter: Callable) -> types.SimpleNamespace:
    """torchcompat, as a module that uses it sees it, with `reduce_scatter`."""
    return types.SimpleNamespace(
        reduce_scatter_tensor=reduce_scatter,
        all_gather_tensor=torchcompat.all_gather_tensor,
    )


def one_more_row(real: property) -> property:
    """FSDP's share computation, wrong: pieces of ceil(rows / N) + 1 rows (every
    row still held once, the bytes not torch.chunk's)."""
    return property(lambda self: real.fget(self) + 1)


def summed_pieces(real: Callable) -> Callable:
    """FSDP's reduce-scatter without its mean: every piece's gradient x N."""

    def reduce_scatter(self: fsdp.Unit) -> None:
        real(self)
        for shard in self.sharded:
            if shard.grad is not None:
                shard.grad.mul_(self.world)

    return reduce_scatter


def root_resharded(self: fsdp.Unit) -> bool:
    """torch's default ignored: the root resharded after forward too."""
    return True if self.reshard_setting is None else bool(self.reshard_setting)


def never_resharded(self: fsdp.Unit) -> bool:
    """reshard_after_forward ignored: every unit kept gathered after forward."""
    return False


def unit_changed(change: Callable[[fsdp.Unit], None]) -> Callable:
    """A plant for Unit.__init__: the real one, then `change(unit)`."""

    def wrap(real: Callable) -> Callable:
        def init(self: fsdp.Unit, *args: Any, **kwargs: Any) -> None:
            real(self, *args, **kwargs)
            change(self)

        return init

    return wrap


def reduce_in_bf16(unit: fsdp.Unit) -> None:
    """The policy's reduce_dtype ignored: gradients reduced in param_dtype."""
    unit.reduce_dtype = unit.param_dtype


def replicas_apart(unit: fsdp.Unit) -> None:
    """HSDP's replicas never all-reduced: each averages its own rows only."""
    unit.replicate = None


def set_requires_gradient_sync(module: torch.nn.Module, requires: bool) -> None:
    """The sync flag ignored: every micro-batch reduce-scatters."""


def dropping(real: Callable) -> Callable:
    """A unit that drops its unsent gradients instead of keeping them."""

    def free(self: fsdp.Unit) -> None:
        if not self.sync:
            for leaf in self.full:
                leaf.grad = None
        real(self)

    return free


def kept_rows_lost(real: Callable) -> Callable:
    """With reshard_after_forward=2: the rows kept after forward zeroed."""

    def after_forward(self: fsdp.Unit, *args: Any) -> Any:
        out = real(self, *args)
        if self.kept is not None:
            self.kept.zero_()
        return out

    return after_forward


def unchecked(self: fsdp_unit.Pending, _sharded: object) -> Tensor:
    """A prefetched gather used without the check that the pieces are unchanged."""
    self.work.wait()
    return self.segments


def group_zeros_rows(real: Callable) -> Callable:
    """The 2-D trainer's rows, wrong: both dp groups train on group 0's rows."""
    return lambda group: real(0)


class _KeptOutput(torch.autograd.Function):
    """An identity that saves its input for backward."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        ctx.save_for_backward(x)
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        return grad


def keeps_its_output(real: Callable) -> Callable:
    """FSDP's post-forward hook passing the output through a Function that saves it
    (a pre-backward hook written as an autograd Function): one more activation."""

    def after_forward(self: fsdp.Unit, module: Any, args: Any, output: Any) -> Any:
        return real(self, module, args, _KeptOutput.apply(output))

    return after_forward


def always_resharded(self: fsdp.Unit) -> bool:
    """reshard_after_forward ignored: every unit resharded after forward."""
    return True


def no_group(size: int) -> None:
    """reshard_after_forward=k's smaller group never made: resharded over all."""


def no_all_reduce(*_: object, **__: object) -> None:
    """The norm's all-reduce left out: each rank's norm of its pieces alone."""


def never_gathers(self: zero.FlatZero, *_: object) -> None:
    """FlatZero's all-gather after the step skipped: others' pieces never arrive."""


def all_reduced(self: zero.FlatZero, k: int, full: Tensor) -> None:
    """Each bucket all-reduced whole, then this rank's piece kept: DP's traffic plus
    the all-gather, for the same numbers."""
    torch.distributed.all_reduce(full, group=self.group)
    piece = full.chunk(self.world)[torch.distributed.get_rank(self.group)]
    self.pieces[k].grad = piece.clone().div_(self.world)


def late(real: Callable) -> Callable:
    """Stage 2 reduce-scattering nothing until backward ends."""
    return lambda self, at_end: real(self, at_end) if at_end else None


def copied(real: Callable) -> Callable:
    """FlatLayout.view returning a copy: each gradient kept apart from the buffer."""
    return lambda self, flat, index: real(self, flat, index).clone()


def with_local(module: object) -> Plant:
    """`module`'s reduce-scatter (through torchcompat) replaced by `kept_local`."""
    return Plant(module, "torchcompat", collectives(kept_local))


RESHARD = "reshard_after_forward"
STALE_PREFETCH = Swap(
    "            after.set_modules_to_backward_prefetch([before])",
    "            after.set_modules_to_backward_prefetch([before])\n"
    "        layers[0].set_modules_to_backward_prefetch([layers[-1]])",
)
FAULTS = {
    "ZeRO-1 unsent": Fault(
        TORCH, Plant(zero.ZeroRedundancyOptimizer, "sync_parameters", never_sent)
    ),
    "FSDP unreduced": Fault(TORCH, with_local(fsdp_unit)),
    "ZeRO shares": Fault(
        [ZERO_1, ZERO_2, *HELD], Plant(partition, "greedy", round_robin)
    ),
    "FSDP shares": Fault(
        [FSDP, *HELD], Plant(layout.Piece, "chunk", one_more_row, wrap=True)
    ),
    "DP as ZeRO": Fault(HELD, Swap("    if stage == 0:", "    if stage == -1:")),
    "ZeRO-2 unreduced": Fault([ZERO_2], with_local(zero_optimizer)),
    "flat never gathers": Fault(
        [FLAT], Plant(zero.FlatZero, "gather_pieces", never_gathers)
    ),
    "flat all-reduced": Fault(
        [FLAT], Plant(zero.FlatZero, "reduce_region", all_reduced)
    ),
    "flat copies": Fault([FLAT], Plant(flat.FlatLayout, "view", copied, wrap=True)),
    "flat late": Fault(
        [FLAT], Plant(zero.FlatZero, "reduce_full_buckets", late, wrap=True)
    ),
    "FSDP all-reduces": Fault(
        [FSDP, FSDP_BYTES],
        Plant(fsdp_unit, "torchcompat", collectives(all_reduced_whole)),
    ),
    "root resharded": Fault(
        SEMANTICS, Plant(fsdp.Unit, RESHARD, property(root_resharded))
    ),
    "reduced in bf16": Fault(
        SEMANTICS, Plant(fsdp.Unit, "__init__", unit_changed(reduce_in_bf16), wrap=True)
    ),
    "summed": Fault(
        SEMANTICS, Plant(fsdp.Unit, "reduce_scatter", summed_pieces, wrap=True)
    ),
    "sync ignored": Fault(
        [*SEMANTICS, "2 micro-batches, one sync"],
        Plant(fsdp_api, "set_requires_gradient_sync", set_requires_gradient_sync),
    ),
    "unsent dropped": Fault(
        [*SEMANTICS, "2 micro-batches, one sync"],
        Plant(fsdp.Unit, "free", dropping, wrap=True),
    ),
    "local norm": Fault(
        [*SEMANTICS, "clip_grad_norm_ to 0.1"],
        Plant(fsdp.grads, "dist", types.SimpleNamespace(all_reduce=no_all_reduce)),
    ),
    "replicas apart": Fault(
        [*SEMANTICS, "HSDP 2x2"],
        Plant(fsdp.Unit, "__init__", unit_changed(replicas_apart), wrap=True),
    ),
    "kept rows lost": Fault(
        [*SEMANTICS, "HSDP 2x2"],
        Plant(fsdp.Unit, "after_forward", kept_rows_lost, wrap=True),
    ),
    "int ignored": Fault(
        [*SEMANTICS, "HSDP 2x2"], Plant(fsdp_api, "smaller_group", no_group)
    ),
    "stale prefetch": Fault(
        ["def prefetching(", "prefetch on = off after"],
        STALE_PREFETCH,
        Plant(fsdp_unit.Pending, "result", unchecked),
    ),
    "no optimizer state": Fault(
        RESUME,
        Swap('        "optim": fsdp.optimizer_state(model, opt),', ""),
        Swap('    fsdp.load_optimizer_state(model, opt, state["optim"])', ""),
    ),
    "dp groups on one's rows": Fault(
        ["mesh, what = Mesh((2, 2)", "for kind in fsdp_tp.OPTIMIZERS:"],
        Plant(fsdp_tp, "slice_of", group_zeros_rows, wrap=True),
    ),
    "output kept": Fault(
        SAVED, Plant(fsdp.Unit, "after_forward", keeps_its_output, wrap=True)
    ),
    "never resharded": Fault(
        [*SAVED, "for reshard in (True, False):"],
        Plant(fsdp.Unit, RESHARD, property(never_resharded)),
    ),
    "always resharded": Fault(
        [*SAVED, "for reshard in (True, False):"],
        Plant(fsdp.Unit, RESHARD, property(always_resharded)),
    ),
}


CONTROLS = harness.Controls(
    "09_zero_fsdp",
    test_a_zero_1_that_never_sends_its_share_fails=harness.Flip(
        ["ZeRO-1 unsent"],
        r"ZeRO-1 (SGD|AdamW): max \|(4 ranks - one process|ours - torch's)\|",
        "ZeRO-1's step never sends the updated share (sync_parameters skipped)",
    ),
    test_an_fsdp_that_never_reduces_fails=harness.Flip(
        ["FSDP unreduced"],
        r"FSDP (SGD|AdamW): max \|(4 ranks - one process|ours - torch's)\|",
        "FSDP's reduce-scatter adding nothing: each rank keeps its own rows' part",
    ),
    test_a_wrong_zero_share_fails_the_formula=harness.Flip(
        ["ZeRO shares"],
        r"bytes held by kind = ZeRO-[12]'s formula",
        "ZeRO's share computed round robin, not largest first to the least held",
    ),
    test_a_wrong_fsdp_share_fails_the_formula=harness.Flip(
        ["FSDP shares"],
        r"bytes held by kind = ZeRO-3's formula",
        "FSDP's pieces of ceil(rows / N) + 1 rows, not torch.chunk's",
    ),
    test_a_dp_that_shards_fails_dps_formula=harness.Flip(
        ["DP as ZeRO"],
        r"DP +\[.*\]: bytes held by kind = DP's formula",
        "the DP run built as ZeRO-2 (its `if stage == 0` branch never taken)",
    ),
    test_a_zero_2_that_never_reduces_fails=harness.Flip(
        ["ZeRO-2 unreduced"],
        r"ZeRO-2 (SGD|AdamW): max \|4 ranks - one process\|",
        "ZeRO-2's reduce-scatter adding nothing: each owner steps on its own rows",
        r"wire bytes of a step \d+ = ZeRO-2's formula",
        "ZeRO-2's reduce-scatter adding nothing: each owner steps on its own rows",
    ),
    test_a_flat_zero_that_never_gathers_fails=harness.Flip(
        ["flat never gathers"],
        r"flat ZeRO-[12] (SGD|AdamW): max \|4 ranks - one process\|",
        "FlatZero's all-gather after the step skipped: other ranks' pieces never "
        "arrive",
    ),
    test_a_flat_zero_that_all_reduces_fails_the_bytes=harness.Flip(
        ["flat all-reduced"],
        r"flat ZeRO-[12]: wire bytes of a step \d+ = 2\(N-1\)/N x padded",
        "FlatZero all-reducing each bucket whole, then slicing: DP's traffic",
    ),
    test_gradients_kept_beside_the_flat_buffer_fail_the_peak=harness.Flip(
        ["flat copies"],
        r"flat ZeRO-1: peak gradient bytes in backward \d+ = formula",
        "FlatZero's view of a tensor in its flat buffer a copy: every gradient also "
        "kept apart from the buffer",
    ),
    test_a_stage_2_that_waits_for_backward_fails_the_peak=harness.Flip(
        ["flat late"],
        r"flat ZeRO-2: peak gradient bytes in backward \d+ = formula",
        "FlatZero's stage 2 reduce-scattering nothing before backward ends",
    ),
    test_an_all_reduce_for_the_reduce_scatter_fails_the_bytes=harness.Flip(
        ["FSDP all-reduces"],
        r"wire bytes of a step \d+ = FSDP's formula",
        "FSDP's reduce-scatter done as an all-reduce, then sliced (twice the bytes)",
    ),
    test_a_resharded_root_fails_torchs_gather_count=harness.Flip(
        ["root resharded"],
        r"\d+ all-gathers a step, as torch's \d+",
        "FSDP's root resharded after forward (torch's default keeps it gathered)",
    ),
    test_gradients_reduced_in_bf16_fail=harness.Flip(
        ["reduced in bf16"],
        r"bf16 params, fp32 reduce: max \|ours - torch's\|",
        "the policy's reduce_dtype ignored: gradients reduced in bf16",
    ),
    test_summed_gradients_fail=harness.Flip(
        ["summed"],
        r"bf16 gradients: max \|ours - fp32 one process\|",
        "FSDP's reduce-scatter without its mean: every gradient x N",
    ),
    test_an_ignored_sync_flag_fails=harness.Flip(
        ["sync ignored"],
        r"one per unit, as torch's",
        "set_requires_gradient_sync ignored: every micro-batch reduce-scatters",
    ),
    test_dropped_unsent_gradients_fail=harness.Flip(
        ["unsent dropped"],
        r"accumulated without sync: max \|ours - (one process|torch's)\|",
        "a unit that drops its unsent gradients instead of keeping them",
    ),
    test_a_local_norm_fails=harness.Flip(
        ["local norm"],
        r"clip_grad_norm_ to 0\.1: max \|ours - (one process|torch's)\|",
        "the norm's all-reduce left out: each rank's norm of its pieces alone",
    ),
    test_unreduced_replicas_fail=harness.Flip(
        ["replicas apart"],
        r"HSDP 2x2 SGD: max \|(4 ranks - one process|ours - torch's)\|",
        "HSDP's replicas never all-reduced: each averages its own rows only",
    ),
    test_lost_kept_rows_fail=harness.Flip(
        ["kept rows lost"],
        r"reshard_after_forward=2 SGD: max \|4 ranks - one process\|",
        "the rows each rank keeps after forward lost (zeroed) before backward",
    ),
    test_an_ignored_int_fails=harness.Flip(
        ["int ignored"],
        r"its gathers before backward over 2 ranks, not 4",
        "reshard_after_forward=2's group never made: resharded over all 4 ranks",
    ),
    test_a_stale_prefetch_fails=harness.Flip(
        ["stale prefetch"],
        r"prefetch on = off after 3 SGD steps, bit for bit",
        "layer 0's backward prefetching the last layer, its gather used stale by the "
        "next forward (the unit's check of its pieces removed)",
        r"\d+ all-gathers, the same calls and wire bytes as without",
        "a stale prefetch, and one gather launched by the last step never used",
    ),
    test_a_resume_without_the_optimizer_state_fails=harness.Flip(
        ["no optimizer state"],
        r"FSDP AdamW saved on 4, resumed on [12]: max \|resumed - never stopped\|",
        "the chapter's load() leaving the optimizer state out (a fresh AdamW resumes)",
    ),
    test_dp_groups_on_the_same_rows_fail=harness.Flip(
        ["dp groups on one's rows"],
        r"FSDP x TP GPT (SGD|AdamW|step-1 gradients): max \|2x2 mesh - one process\|",
        "both dp groups train on dp group 0's rows",
    ),
    test_a_unit_that_keeps_its_output_fails=harness.Flip(
        ["output kept"],
        r"activations the same for every stage and N",
        "FSDP's post-forward hook passing the output through a Function that saves it "
        "for backward",
    ),
    test_units_never_resharded_fail=harness.Flip(
        ["never resharded"],
        r"saved for backward by kind = formula, 4 stages x N = 1, 2, 4",
        "reshard_after_forward ignored: every unit kept gathered after forward",
        r"reshard_after_forward=True: gathered at most \d+ bytes at once",
        "reshard_after_forward ignored: every unit kept gathered after forward",
    ),
    test_units_always_resharded_fail=harness.Flip(
        ["always resharded"],
        r"reshard_after_forward=False: gathered at most \d+ bytes at once",
        "reshard_after_forward ignored: every unit resharded after forward",
    ),
)
globals().update(CONTROLS.tests())
