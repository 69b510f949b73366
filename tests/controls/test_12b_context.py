"""Negative controls for chapter 12b's verdicts: the same checks, on planted faults.

One spawn of 4 ranks (the chapter's count) reruns each check the chapter prints
(`check.against_full_attention`, `check.wire_and_memory`,
`check.full_attention_kept`, `cg.against_one_process`, `cg.step_bytes`,
`torch_side.shard`) with a fault planted, and builds each verdict line as the
chapter does; every line must say FAIL or False.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from distcourse import checks, runtime
from distcourse.comm.autograd import all_gather_along
from distcourse.comm.ledger import Ledger
from distcourse.examples.gpt import GPTConfig, TinyGPT, token_batches
from distcourse.launch import spawn
from distcourse.mesh import Mesh
from distcourse.parallel import context
from distcourse.parallel.context import check, torch_side
from distcourse.parallel.context import gpt as cg

SHAPE = (2, 2, 16, 4)


def _gathered(q: Tensor, k: Tensor, v: Tensor, group: object, **kw: object) -> Tensor:
    """Not a ring: every rank all-gathers K and V and attends to the whole sequence
    at once (keeping all of it for backward)."""
    cp, rank, layout = dist.get_world_size(group), dist.get_rank(group), kw["layout"]
    keys, values = (all_gather_along(t, 2, group) for t in (k, v))
    seq = q.size(2) * cp
    mine = context.positions(seq, cp, rank, layout)
    theirs = torch.cat([context.positions(seq, cp, r, layout) for r in range(cp)])
    mask = (theirs[None, :] <= mine[:, None]).to(q.device) if kw["causal"] else None
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)


class FromZero(cg.ContextGPT):
    """The chapter's pitfall: every rank numbers its tokens from 0."""

    def token_positions(self, local: int) -> Tensor:
        return torch.arange(local)


def _only_dp(model: nn.Module, mesh: Mesh) -> None:
    """The cp all-reduce forgotten: averaged over dp only."""
    for p in model.parameters():
        dist.all_reduce(p.grad, group=mesh.group("dp"))
        p.grad /= mesh.size("dp")


def _summed_dp(model: nn.Module, mesh: Mesh) -> None:
    """Summed over cp and dp, divided by cp only: dp times too long a step."""
    for p in model.parameters():
        dist.all_reduce(p.grad, group=mesh.group("cp"))
        dist.all_reduce(p.grad, group=mesh.group("dp"))
        p.grad /= mesh.size("cp")


def _attention(lines: dict[str, str]) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    solos = [dist.new_group([r]) for r in range(world)]  # every rank makes each

    def alone(q: Tensor, k: Tensor, v: Tensor, group: object, **kw: object) -> Tensor:
        return context.ring_attention(q, k, v, solos[rank], **kw)

    for causal in (True, False):
        for layout in context.LAYOUTS:
            diffs = check.against_full_attention(
                SHAPE, causal=causal, layout=layout, attention=alone
            )
            name = f"{'causal' if causal else 'full'} {layout}"
            verdict = checks.verdict(max(diffs.values()), 1e-5)
            what = "max |4 ranks - one process| of out, dq, dk, dv"
            lines[name] = f"{name:>17}: {what} {verdict}"
    unchecked = partial(context.ring_attention, check=False)
    sent, formula = check.wire_and_memory(SHAPE, attention=unchecked)["wire"]
    lines["wire"] = (
        f"wire bytes of one call {sent} = the ring's formula: {sent == formula}"
    )
    kept, formula = check.wire_and_memory(SHAPE, attention=_gathered)["kept"]
    lines["kept"] = f"kept for backward {kept} bytes = formula: {kept == formula}"
    whole, share = check.full_attention_kept(SHAPE, device="cpu"), kept * world
    lines["share"] = (
        f"one process on SDPA's CPU kernel keeps {whole} bytes; "
        f"each rank 1/{world} of it: {share == whole}"
    )
    for layout, other in zip(context.LAYOUTS, context.LAYOUTS[::-1], strict=True):

        def ignoring(*args: Tensor, other: str = other, **kw: object) -> Tensor:
            return context.ring_attention(*args, **{**kw, "layout": other})

        cost = check.wire_and_memory(SHAPE, layout=layout, attention=ignoring)
        blocks, formula = cost["blocks"]
        lines[f"blocks {layout}"] = (
            f"{layout:>10}: {blocks} blocks computed = formula: {blocks == formula}"
        )
    x = torch.arange(16.0, device=runtime.device()).view(1, 1, 16, 1)
    same = torch.equal(
        torch_side.shard(x, 2), context.shard(x, 2, world, rank, "contiguous")
    )
    lines["torch"] = (
        f"torch's context_parallel holds the same tokens as our zig-zag: {same}"
    )


def _faults() -> dict[str, str]:
    torch.set_num_threads(1)
    lines: dict[str, str] = {}
    _attention(lines)
    cfg, batches = GPTConfig(), token_batches(3, 4, GPTConfig())
    mesh = cg.make_mesh(2)
    faults = {  # (fault, layout): what is planted
        ("only dp", "zigzag"): {"reduce": _only_dp},
        ("only dp", "contiguous"): {"reduce": _only_dp},
        ("summed dp", "zigzag"): {"reduce": _summed_dp},
        ("from zero", "contiguous"): {"wrap": FromZero},
    }
    for (fault, layout), options in faults.items():
        grads, params = cg.against_one_process(
            mesh, cfg, batches, layout=layout, **options
        )
        what = f"dp x cp 2x2 {layout}:"
        lines[fault, layout, "grads"] = (
            f"{what} step-1 gradients, max |4 ranks - one process| "
            + checks.verdict(grads, 1e-5)
        )
        lines[fault, layout, "params"] = (
            f"{what} parameters after 3 SGD steps " + checks.verdict(params, 1e-5)
        )
    device = runtime.device()  # as the chapter: the model and batch on the device
    model = cg.ContextGPT(TinyGPT(cfg).to(device), mesh.group("cp"))
    first = [(x.to(device), y.to(device)) for x, y in batches[:1]]
    with Ledger() as ledger:
        cg.train_dp_cp(model, first, mesh, reduce=_only_dp)
    sent = ledger.bytes_sent()
    want = cg.step_bytes(model, tuple(first[0][0].shape), mesh)
    lines["step bytes"] = (
        f"wire bytes of a dp x cp step {sent} = formula: {sent == want}"
    )
    grads, _ = cg.against_one_process(mesh, cfg, batches)  # positions right
    seen = grads > 1e-5
    lines["pitfall"] = (
        f"positions 0..T/cp-1 on every rank: gradients differ from one process: {seen}"
    )
    return lines


@pytest.fixture(scope="module")
def lines() -> dict:
    return spawn(_faults, 4, timeout=60)[0]


@pytest.mark.controls(
    "12b_context",
    r"(causal|full) (zigzag|contiguous): max \|4 ranks - one process\| of out, dq",
    fault="keys and values never passed round: each rank attends to its own tokens",
)
def test_attention_without_the_ring_fails_against_one_process(lines: dict) -> None:
    for name in (
        "causal zigzag",
        "causal contiguous",
        "full zigzag",
        "full contiguous",
    ):
        assert lines[name].endswith("FAIL"), lines[name]


@pytest.mark.controls(
    "12b_context",
    r"wire bytes of one call \d+ = the ring's formula",
    fault="the agreement check skipped (check=False): 112 bytes per peer fewer",
)
def test_a_call_without_its_check_fails_the_byte_formula(lines: dict) -> None:
    assert lines["wire"].endswith("False"), lines["wire"]


@pytest.mark.controls(
    "12b_context",
    r"kept for backward \d+ bytes = formula",
    fault="K and V all-gathered and attended at once, the whole sequence kept",
)
@pytest.mark.controls(
    "12b_context",
    r"one process on SDPA's CPU kernel keeps \d+ bytes; each rank 1/4 of it",
    fault="K and V all-gathered and attended at once, the whole sequence kept",
)
def test_gathering_the_sequence_fails_the_memory_checks(lines: dict) -> None:
    for name in ("kept", "share"):
        assert lines[name].endswith("False"), lines[name]


@pytest.mark.controls(
    "12b_context",
    r"(zigzag|contiguous): \d+ blocks computed = formula",
    fault="the layout argument ignored: the other split's blocks computed",
)
def test_the_other_split_fails_the_block_formula(lines: dict) -> None:
    for layout in context.LAYOUTS:
        assert lines[f"blocks {layout}"].endswith("False"), lines[f"blocks {layout}"]


@pytest.mark.controls(
    "12b_context",
    r"torch's context_parallel holds the same tokens as our zig-zag",
    fault="our contiguous split compared with torch's",
)
def test_the_contiguous_split_is_not_torchs(lines: dict) -> None:
    assert lines["torch"].endswith("False"), lines["torch"]


@pytest.mark.controls(
    "12b_context",
    r"dp x cp 2x2 (zigzag|contiguous): step-1 gradients, max \|4 ranks - one",
    fault="gradients averaged over dp only (no cp all-reduce); summed over dp; "
    "positions counted from 0 on every rank",
)
@pytest.mark.controls(
    "12b_context",
    r"dp x cp 2x2 (zigzag|contiguous): parameters after 3 SGD steps",
    fault="gradients averaged over dp only (no cp all-reduce); summed over dp; "
    "positions counted from 0 on every rank",
)
def test_faulty_dp_x_cp_fails_against_one_process(lines: dict) -> None:
    planted = [key for key in lines if isinstance(key, tuple)]
    assert len(planted) == 4 * 2  # each layout under two faults, grads and params
    for key in planted:
        assert lines[key].endswith("FAIL"), lines[key]


@pytest.mark.controls(
    "12b_context",
    r"positions 0\.\.T/cp-1 on every rank: gradients differ from one process",
    fault="positions right (ContextGPT itself): nothing for the check to see",
)
def test_right_positions_do_not_differ(lines: dict) -> None:
    assert lines["pitfall"].endswith("False"), lines["pitfall"]


@pytest.mark.controls(
    "12b_context",
    r"wire bytes of a dp x cp step \d+ = formula",
    fault="gradients averaged over dp only: the cp all-reduces never sent",
)
def test_a_step_without_the_cp_all_reduce_fails_the_byte_formula(lines: dict) -> None:
    assert lines["step bytes"].endswith("False"), lines["step bytes"]
