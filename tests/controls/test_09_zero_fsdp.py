"""Negative controls for chapter 9's verdicts: the same checks, on planted faults.

One spawn of 4 ranks (the chapter's count) trains each strategy with a fault and
prints each verdict line as the chapter does (`checks.verdict` of the largest
difference over ranks; `zero.held == zero.formula`; `ledger.bytes_sent() ==
step_bytes`); every line must say FAIL or False.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch
from torch import nn
from torch.distributed.fsdp import fully_shard as torch_fully_shard

from distcourse import checks, runtime
from distcourse.comm.ledger import Ledger
from distcourse.examples import sharding as ex
from distcourse.launch import spawn
from distcourse.mesh import Mesh
from distcourse.parallel import fsdp, hybrid, zero
from distcourse.parallel.ddp import DDP
from distcourse.parallel.hybrid import fsdp_tp
from distcourse.parallel.zero.memory import expected_share


class Unsynced(zero.ZeroRedundancyOptimizer):
    """A ZeRO-1 that never sends its updated shard: the others keep stale copies."""

    def sync_parameters(self) -> None:
        pass


def _versus(state: dict, reference: dict, what: str) -> str:
    diff = checks.max_over_ranks(ex.max_difference(state, reference))
    return f"{what} {checks.verdict(diff, 1e-5)}"


def _sharded(model: nn.Sequential, shard=fsdp.fully_shard) -> nn.Sequential:  # noqa: ANN001
    for module in [*model[::2], model]:
        shard(module)
    return model


def torch_on_this_device(module: nn.Module) -> nn.Module:
    """torch's fully_shard on the rank's device: its default mesh takes the GPU
    whenever one is visible, also for CPU ranks."""
    return torch_fully_shard(module, mesh=fsdp.world_mesh())


def _zero(model: nn.Module, kind: str, cls=zero.ZeroRedundancyOptimizer):  # noqa: ANN001, ANN202
    opt_cls, options = ex.OPTIMIZERS[kind]
    return cls(model.parameters(), opt_cls, **options)


def _faults() -> dict[str, str]:
    rank, world = runtime.require_initialized().rank, 4
    lines: dict[str, str] = {}

    def scaled(model: nn.Module):  # noqa: ANN202
        def scale() -> None:
            for p in model.parameters():
                if p.grad is not None:
                    p.grad *= world

        return scale

    ref = {kind: ex.one_process(world, kind) for kind in ex.OPTIMIZERS}
    one = "max |4 ranks - one process|"
    # SGD, gradients summed instead of averaged
    m1 = ex.uneven_mlp()
    ex.train(DDP(m1), _zero(m1, "SGD"), rank, before_step=scaled(m1))
    lines["ZeRO-1 SGD"] = _versus(m1.state_dict(), ref["SGD"], f"ZeRO-1 SGD: {one}")
    m2 = ex.uneven_mlp()
    opt2 = _zero(m2, "SGD")
    ex.train(zero.ShardedDDP(m2, opt2), opt2, rank, before_step=scaled(m2))
    lines["ZeRO-2 SGD"] = _versus(m2.state_dict(), ref["SGD"], f"ZeRO-2 SGD: {one}")
    m3 = _sharded(ex.uneven_mlp())
    ex.train(m3, ex.optimizer("SGD", m3.parameters()), rank, before_step=scaled(m3))
    full3 = fsdp.full_state_dict(m3)
    lines["FSDP SGD"] = _versus(full3, ref["SGD"], f"FSDP SGD: {one}")
    # AdamW (blind to a gradient's scale): every rank trains on rank 0's rows
    a1 = ex.uneven_mlp()
    ex.train(DDP(a1), _zero(a1, "AdamW"), 0)
    lines["ZeRO-1 AdamW"] = _versus(
        a1.state_dict(), ref["AdamW"], f"ZeRO-1 AdamW: {one}"
    )
    a2 = ex.uneven_mlp()
    opt = _zero(a2, "AdamW")
    ex.train(zero.ShardedDDP(a2, opt), opt, 0)
    lines["ZeRO-2 AdamW"] = _versus(
        a2.state_dict(), ref["AdamW"], f"ZeRO-2 AdamW: {one}"
    )
    a3 = _sharded(ex.uneven_mlp())
    ex.train(a3, ex.optimizer("AdamW", a3.parameters()), 0)
    full = fsdp.full_state_dict(a3)
    lines["FSDP AdamW"] = _versus(full, ref["AdamW"], f"FSDP AdamW: {one}")
    # ZeRO-1 whose shards are never sent: the ranks drift apart
    m4 = ex.uneven_mlp()
    ex.train(DDP(m4), _zero(m4, "AdamW", Unsynced), rank)
    lines["unsynced"] = _versus(m4.state_dict(), ref["AdamW"], f"ZeRO-1 AdamW: {one}")
    lines.update(_bytes(rank))
    faulty = {
        ("ZeRO-1", "SGD"): m1.state_dict(),
        ("FSDP", "SGD"): full3,
        ("ZeRO-1", "AdamW"): a1.state_dict(),
        ("FSDP", "AdamW"): full,
    }
    lines.update(_versus_torch(rank, faulty))
    lines.update(_resumed(rank))
    lines.update(_fsdp_tp(rank))
    lines.update(_prefetch(rank))
    return lines


def _fsdp_tp(rank: int) -> dict[str, str]:
    """The chapter's 2x2 TinyGPT checks on faults: SGD (step 1's gradients and 3
    steps) with gradients summed over dp; AdamW with both dp groups on group 0's
    rows."""
    mesh, lines = Mesh((2, 2), ("dp", "tp")), {}
    what = "max |2x2 mesh - one process|"

    def summed(model: nn.Module) -> None:
        for p in model.parameters():
            p.grad *= 2

    lr, start = fsdp_tp.OPTIMIZERS["SGD"][1]["lr"], fsdp_tp.start_gpt()
    after = hybrid.full_state_dict(fsdp_tp.train_gpt(mesh, "SGD", 1, summed), mesh)
    ref = fsdp_tp.one_process_gpt("SGD", 1)
    steps = [{k: (start[k] - s[k]) / lr for k in start} for s in (after, ref)]
    diff = checks.max_over_ranks(fsdp_tp.difference(*steps, "SGD"))
    lines["2x2 gradients"] = (
        f"FSDP x TP GPT step-1 gradients: {what} {checks.verdict(diff, 1e-5)}"
    )
    for kind, fault in (("SGD", {"before_step": summed}), ("AdamW", {"rows": 0})):
        model = fsdp_tp.train_gpt(mesh, kind, 3, **fault)
        full = hybrid.full_state_dict(model, mesh)
        diff = fsdp_tp.difference(full, fsdp_tp.one_process_gpt(kind, 3), kind)
        verdict = checks.verdict(checks.max_over_ranks(diff), 1e-5)
        lines[f"2x2 {kind}"] = f"FSDP x TP GPT {kind}: {what} {verdict}"
    return lines


def _resumed(rank: int) -> dict[str, str]:
    """The chapter's resharding check, resumed with a fresh AdamW state: the
    checkpoint's parameters are loaded, its optimizer state is not."""
    import shutil
    import tempfile

    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    import torch.nn.functional as F
    from torch.distributed.device_mesh import DeviceMesh

    box = [tempfile.mkdtemp(prefix="ch9-control-") if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    saved = _sharded(ex.uneven_mlp())
    opt = ex.optimizer("AdamW", saved.parameters())
    ex.train(saved, opt, rank, steps=2)
    state = {
        "model": fsdp.model_state(saved),
        "optim": fsdp.optimizer_state(saved, opt),
    }
    dcp.save(state, checkpoint_id=box[0])
    never_stopped, lines = ex.one_process(4, "AdamW", steps=4), {}
    for members in ([0, 1], [0]):
        group, diff = dist.new_group(members), 0.0
        if rank in members:
            mesh = DeviceMesh.from_group(group, "cpu")
            model = _sharded(ex.uneven_mlp(), partial(fsdp.fully_shard, mesh=mesh))
            opt = ex.optimizer("AdamW", model.parameters())
            state = {"model": fsdp.model_state(model)}
            dcp.load(state, checkpoint_id=box[0], process_group=group)
            fsdp.load_model_state(model, state["model"])  # planted: no optimizer
            per, me = 4 // len(members), members.index(rank)
            for step in (2, 3):
                rows = [ex.batch(step, q) for q in range(me * per, (me + 1) * per)]
                x, y = (torch.cat(t) for t in zip(*rows, strict=True))
                opt.zero_grad()
                F.mse_loss(model(x), y).backward()
                opt.step()
            diff = ex.max_difference(fsdp.full_state_dict(model), never_stopped)
        what = f"FSDP AdamW saved on 4, resumed on {len(members)}"
        lines[f"resumed {len(members)}"] = _versus_diff(diff, what)
    dist.barrier()
    if rank == 0:
        shutil.rmtree(box[0])
    return lines


def _versus_diff(diff: float, what: str) -> str:
    verdict = checks.verdict(checks.max_over_ranks(diff), 1e-5)
    return f"{what}: max |resumed - never stopped| {verdict}"


def _bytes(rank: int) -> dict[str, str]:
    """Bytes held and sent, measured on the wrong strategy for the formula."""
    lines = {}
    dp = ex.uneven_mlp()  # plain AdamW under DDP: the state whole on every rank
    opt = ex.optimizer("AdamW", dp.parameters())
    ex.train(DDP(dp), opt, rank, steps=1)
    total = sum(p.numel() for p in dp.parameters())
    shapes = [tuple(p.shape) for p in dp.parameters()]
    for stage in (1, 2):  # a ZeRO that keeps every state: the chapter's shares
        mine = expected_share(shapes, 4, rank, stage)
        got, want = zero.held(dp.parameters(), opt), zero.formula(stage, total, *mine)
        lines[f"held {stage}"] = (
            f"bytes held by kind = ZeRO-{stage}'s formula: {got == want}"
        )
    z1 = ex.uneven_mlp()  # ZeRO-2's formula, on ZeRO-1 (gradients all-reduced)
    opt1 = _zero(z1, "AdamW")
    net = DDP(z1)
    with Ledger() as ledger:
        ex.train(net, opt1, rank, steps=1)
    got, want = zero.held(z1.parameters(), opt1), zero.formula(0, total, total, 6)
    lines["held 0"] = f"bytes held by kind = DP's formula: {got == want}"
    want = zero.step_bytes(2, opt1.partition.numel, opt1.partition.width, rank)
    sent = ledger.bytes_sent()
    lines["wire 2"] = f"wire bytes of a step {sent} = ZeRO-2's formula: {sent == want}"
    never = ex.uneven_mlp()  # ZeRO-3's formula, on an FSDP that never shards
    opt3 = ex.optimizer("AdamW", never.parameters())
    ex.train(DDP(never), opt3, rank, steps=1)
    want = zero.formula(3, total, *expected_share(shapes, 4, rank, 3))
    got = zero.held(never.parameters(), opt3)
    lines["held 3"] = f"bytes held by kind = ZeRO-3's formula: {got == want}"
    f3 = _sharded(ex.uneven_mlp())  # FSDP whose model runs twice in a step
    twice = nn.Sequential(f3, nn.Linear(3, 6), f3)
    with Ledger() as ledger:
        ex.train(twice, ex.optimizer("SGD", f3.parameters()), rank, steps=1)
    sent, want = ledger.bytes_sent(), fsdp.step_bytes(fsdp.units(f3), 4)
    lines["wire 3"] = f"wire bytes of a step {sent} = FSDP's formula: {sent == want}"
    return lines


def _versus_torch(rank: int, ours: dict[tuple[str, str], dict]) -> dict[str, str]:
    """Torch's, trained right, against ours trained with a fault (`ours`: the state
    dicts by strategy and optimizer)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
    )
    from torch.distributed.optim import ZeroRedundancyOptimizer as TorchZero
    from torch.nn.parallel import DistributedDataParallel

    lines = {}
    for kind in ex.OPTIMIZERS:
        theirs = ex.uneven_mlp()
        opt = _zero(theirs, kind, TorchZero)
        ex.train(DistributedDataParallel(theirs), opt, rank)
        what = f"ZeRO-1 {kind}: max |ours - torch's|"
        lines[f"torch ZeRO-1 {kind}"] = _versus(
            theirs.state_dict(), ours["ZeRO-1", kind], what
        )
        theirs = _sharded(ex.uneven_mlp(), torch_on_this_device)
        ex.train(theirs, ex.optimizer(kind, theirs.parameters()), rank)
        options = StateDictOptions(full_state_dict=True)
        full = get_model_state_dict(theirs, options=options)
        what = f"FSDP {kind}: max |ours - torch's|"
        lines[f"torch FSDP {kind}"] = _versus(full, ours["FSDP", kind], what)
    return lines


def _prefetch(rank: int) -> dict[str, str]:
    """The chapter's prefetch checks, against a prefetch that goes stale: the first
    layer's backward prefetches the last layer, whose gather the next forward then
    uses after the optimizer step, with the unit's staleness check removed (and one
    gather launched by the last step, never used)."""

    def unchecked(self: fsdp.unit.Pending, _sharded: object) -> torch.Tensor:
        self.work.wait()
        return self.segments

    def trained(prefetch: bool) -> tuple[nn.Module, Ledger]:
        model = _sharded(ex.uneven_mlp())
        if prefetch:
            model[0].set_modules_to_backward_prefetch([model[4]])
        with Ledger() as ledger:
            ex.train(model, ex.optimizer("SGD", model.parameters()), rank)
        return model, ledger

    checked = fsdp.unit.Pending.result
    (off, sent_off) = trained(False)
    fsdp.unit.Pending.result = unchecked
    try:
        (on, sent_on) = trained(True)
    finally:
        fsdp.unit.Pending.result = checked
    full = fsdp.full_state_dict(on), fsdp.full_state_dict(off)
    diff = checks.max_over_ranks(ex.max_difference(*full))
    lines = {
        "prefetch": f"prefetch on = off after 3 SGD steps, bit for bit: {diff == 0}"
    }
    calls = [sum("all_gather" in r.op for r in s.records) for s in (sent_off, sent_on)]
    same = calls[0] == calls[1] and sent_off.bytes_sent() == sent_on.bytes_sent()
    what = "the same calls and wire bytes as without"
    lines["prefetch bytes"] = f"{calls[1]} all-gathers, {what}: {same}"
    return lines


@pytest.fixture(scope="module")
def lines() -> dict[str, str]:
    torch.set_num_threads(1)
    return spawn(_faults, 4, timeout=30)[0]


@pytest.mark.controls(
    "09_zero_fsdp",
    r"(ZeRO-1|ZeRO-2|FSDP) SGD: max \|4 ranks - one process\|",
    fault="every gradient multiplied by the world size (summed, not averaged)",
)
def test_summed_gradients_fail_against_one_process(lines: dict[str, str]) -> None:
    for name in ("ZeRO-1 SGD", "ZeRO-2 SGD", "FSDP SGD"):
        assert lines[name].endswith("FAIL"), lines[name]


@pytest.mark.controls(
    "09_zero_fsdp",
    r"(ZeRO-1|ZeRO-2|FSDP) AdamW: max \|4 ranks - one process\|",
    fault="every rank trains on rank 0's rows; ZeRO-1 whose shards are never sent",
)
def test_wrong_rows_or_unsent_shards_fail_with_adamw(lines: dict[str, str]) -> None:
    for name in ("ZeRO-1 AdamW", "ZeRO-2 AdamW", "FSDP AdamW", "unsynced"):
        assert lines[name].endswith("FAIL"), lines[name]


@pytest.mark.controls(
    "09_zero_fsdp",
    r"bytes held by kind = (DP|ZeRO-[123])'s formula",
    fault="ZeRO-1 measured against DP's formula; a ZeRO-1/2 that keeps every "
    "state; an FSDP that never shards (shares from the shapes, as the chapter's)",
)
def test_a_stage_that_keeps_state_whole_fails_its_formula(
    lines: dict[str, str],
) -> None:
    for name in ("held 0", "held 1", "held 2", "held 3"):
        assert lines[name].endswith("False"), lines[name]


@pytest.mark.controls(
    "09_zero_fsdp",
    r"wire bytes of a step \d+ = (ZeRO-2|FSDP)'s formula",
    fault="gradients all-reduced (ZeRO-1), not reduce-scattered; FSDP run twice",
)
def test_other_traffic_fails_the_byte_formulas(lines: dict[str, str]) -> None:
    for name in ("wire 2", "wire 3"):
        assert lines[name].endswith("False"), lines[name]


@pytest.mark.controls(
    "09_zero_fsdp",
    r"(ZeRO-1|FSDP) SGD: max \|ours - torch's\|",
    fault="ours trained with gradients summed over ranks, torch's right",
)
@pytest.mark.controls(
    "09_zero_fsdp",
    r"(ZeRO-1|FSDP) AdamW: max \|ours - torch's\|",
    fault="ours trained on rank 0's rows on every rank, torch's right",
)
def test_faulty_ours_fails_against_torchs(lines: dict[str, str]) -> None:
    for strategy in ("ZeRO-1", "FSDP"):
        for kind in ex.OPTIMIZERS:
            line = lines[f"torch {strategy} {kind}"]
            assert line.endswith("FAIL"), line


@pytest.mark.controls(
    "09_zero_fsdp",
    r"FSDP AdamW saved on 4, resumed on [12]: max \|resumed - never stopped\|",
    fault="the checkpoint's parameters loaded, its AdamW state not (a fresh one)",
)
def test_a_resume_without_the_optimizer_state_fails(lines: dict[str, str]) -> None:
    for name in ("resumed 2", "resumed 1"):
        assert lines[name].endswith("FAIL"), lines[name]


@pytest.mark.controls(
    "09_zero_fsdp",
    r"FSDP x TP GPT (SGD|AdamW|step-1 gradients): max \|2x2 mesh - one process\|",
    fault="SGD: gradients summed over dp; AdamW: both dp groups on group 0's rows",
)
def test_a_faulty_2d_run_fails_against_one_process(lines: dict[str, str]) -> None:
    for name in ("2x2 gradients", "2x2 SGD", "2x2 AdamW"):
        assert lines[name].endswith("FAIL"), lines[name]


@pytest.mark.controls(
    "09_zero_fsdp",
    r"prefetch on = off after 3 SGD steps, bit for bit",
    fault="a gather prefetched by the last backward, used stale by the next forward",
)
@pytest.mark.controls(
    "09_zero_fsdp",
    r"\d+ all-gathers, the same calls and wire bytes as without",
    fault="a stale prefetch, and one gather launched by the last step never used",
)
def test_a_stale_prefetch_fails_against_no_prefetch(lines: dict[str, str]) -> None:
    for name in ("prefetch", "prefetch bytes"):
        assert lines[name].endswith("False"), lines[name]
