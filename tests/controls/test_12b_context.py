"""Negative controls for chapter 12b's verdicts: the same checks, on planted faults.

One spawn of 4 ranks (the chapter's count) reruns each check the chapter prints
(`check.against_full_attention`, `check.wire_and_memory`, `check.ulysses_cost`,
`check.full_attention_kept`, `cg.against_one_process`, `cg.step_bytes`,
`torch_side.shard`) with a fault planted in the code it runs, and builds each verdict
line as the chapter does; every line must say FAIL or False. Most faults replace one
function of `ring`, `ulysses` or `split` for the length of one check (`planted`):
the last dK/dV hop left out, the diagonal block masked on the wrong side, the online
softmax without its rescale, a K/V head's gradient not summed over its q heads,
Ulysses's head groups dealt round-robin, its q, k, v sent in three all_to_alls, the
zig-zag pair held in the wrong order.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from helpers import planted
from torch import Tensor, nn

from distcourse import checks, runtime
from distcourse.comm.autograd import all_gather_along, all_to_all_along
from distcourse.comm.ledger import Ledger
from distcourse.examples.gpt import GPTConfig, TinyGPT, token_batches
from distcourse.launch import spawn
from distcourse.mesh import Mesh
from distcourse.parallel import context
from distcourse.parallel.context import check, ring, split, torch_side, ulysses
from distcourse.parallel.context import gpt as cg

SHAPE = (2, 2, 16, 4)
GQA = (2, 8, 16, 4)  # the chapter's 8 heads of q
WHAT = "max |4 ranks - one process| of out, dq, dk, dv"


def _no_last_hop(ring_: ring.Ring, buf: Tensor) -> tuple[Tensor, Tensor]:
    """The dK/dV sums kept one rank before their owner: the last pass left out."""
    return buf[2].clone(), buf[3].clone()


_real_mask = ring.block_mask


def _upper_mask(*args: object, **kw: object) -> Tensor | str | None:
    """The diagonal block masked on the wrong side: keys at or after the query."""
    mask = _real_mask(*args, **kw)
    return mask.transpose(-2, -1) if isinstance(mask, Tensor) else mask


def _no_rescale(stats: ring.Stats, s: Tensor, v: Tensor) -> ring.Stats:
    """The online softmax with a new max but the old sums not rescaled to it."""
    m, l_, acc = stats
    new = torch.maximum(m, s.amax(-1, keepdim=True))
    p = torch.exp(s - new)
    return new, l_ + p.sum(-1, keepdim=True), acc + p @ v


def _first_of_group(grad: Tensor, kv_heads: int) -> Tensor:
    """A K/V head's gradient taken from the first q head that reads it, not summed."""
    return grad.unflatten(1, (kv_heads, -1))[:, :, 0]


def _round_robin(x: Tensor, cp: int) -> Tensor:
    """Heads dealt round-robin (rank j: heads j, j + cp, ...) on the way in, while the
    way back puts them together in blocks."""
    return x.unflatten(1, (x.size(1) // cp, cp)).transpose(1, 2)


def _three_messages(parts: list[Tensor], cp: int, group: object) -> Tensor:
    """q, k and v sent in an all_to_all each: the same data, three size exchanges."""
    got = [
        all_to_all_along(ulysses.head_groups(t, cp), 1, 3, group, check=False)
        for t in parts
    ]
    return torch.cat(got, 2).squeeze(1)


def _swapped_pair(cp: int, rank: int, layout: str = "zigzag") -> tuple[int, int]:
    """The zig-zag pair held late chunk first: chunks 2·cp − 1 − r, then r."""
    return 2 * cp - 1 - rank, rank


def _expanded(q: Tensor, k: Tensor, v: Tensor, group: object, **kw: object) -> Tensor:
    """Ulysses given K/V repeated to q's heads (a model without enable_gqa)."""
    g = q.size(1) // k.size(1)
    k, v = (t.repeat_interleave(g, 1) for t in (k, v))
    return context.ulysses_attention(q, k, v, group, **kw)


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


RING_FAULTS = {  # fault: (module, name, replacement)
    "no last hop": (ring, "send_home", _no_last_hop),
    "upper mask": (ring, "block_mask", _upper_mask),
    "no rescale": (ring, "online_update", _no_rescale),
}


def _ring_lines(lines: dict) -> None:
    """Step 2's four lines under each fault of the ring, and Step 3's bytes."""
    for fault, (module, name, fake) in RING_FAULTS.items():
        with planted(module, name, fake):
            for causal in (True, False):
                for layout in context.LAYOUTS:
                    diffs = check.against_full_attention(
                        SHAPE, causal=causal, layout=layout
                    )
                    name_ = f"{'causal' if causal else 'full'} {layout}"
                    verdict = checks.verdict(max(diffs.values()), 1e-5)
                    lines[fault, name_] = f"{name_:>17}: {WHAT} {verdict}"
    with planted(ring, "sum_over_group", _first_of_group):
        for kv_heads in (2, 1):
            diffs = check.against_full_attention(GQA, kv_heads=kv_heads)
            verdict = checks.verdict(max(diffs.values()), 1e-5)
            lines["gqa", kv_heads] = (
                f"ring, 8 q heads, {kv_heads} K/V: {WHAT} {verdict}"
            )
    with planted(ring, "send_home", _no_last_hop):
        sent, formula = check.wire_and_memory(SHAPE)["wire"]
    lines["wire"] = (
        f"wire bytes of one call {sent} = the ring's formula: {sent == formula}"
    )


def _ulysses_lines(lines: dict) -> None:
    """The Ulysses section's lines, each under its fault."""
    HEADS = GQA
    with planted(ulysses, "head_groups", _round_robin):
        for kv_heads in (8, 4):
            for causal in (True, False):
                diffs = check.against_full_attention(
                    HEADS,
                    causal=causal,
                    kv_heads=kv_heads,
                    attention=context.ulysses_attention,
                )
                name = f"Ulysses {'causal' if causal else 'full'}, {kv_heads} K/V heads"
                verdict = checks.verdict(max(diffs.values()), 1e-5)
                lines["ulysses", kv_heads, causal] = f"{name}: {WHAT} {verdict}"
    with planted(ulysses, "scatter_heads", _three_messages):
        for kv_heads in (8, 4):
            sent, formula = check.ulysses_cost(HEADS, kv_heads=kv_heads)["wire"]
            ring_ = check.wire_and_memory(HEADS, kv_heads=kv_heads)["wire"][0]
            lines["ulysses wire", kv_heads] = (
                f"{kv_heads} K/V heads: ring attention sends {ring_}; Ulysses wire "
                f"bytes of one call {sent} = formula: {sent == formula}"
            )
    cost = check.ulysses_cost(HEADS, kv_heads=4, attention=_expanded)
    kept, whole = cost["share"]
    ring_ = check.wire_and_memory(HEADS, kv_heads=4)["kept"][0]
    world = dist.get_world_size()
    lines["ulysses kept"] = (
        f"4 K/V heads: a ring rank keeps {ring_} bytes for backward; Ulysses "
        f"{kept // world}, 1/{world} of one process's SDPA on this device: "
        f"{kept == whole}"
    )


def _attention(lines: dict) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    _ring_lines(lines)
    _ulysses_lines(lines)
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
    with planted(split, "chunk_ids", _swapped_pair):
        same = torch.equal(torch_side.shard(x, 2), context.shard(x, 2, world, rank))
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
    fault="ring.send_home left out: the dK/dV sums stay one rank before their owner",
)
@pytest.mark.controls(
    "12b_context",
    r"(causal|full) (zigzag|contiguous): max \|4 ranks - one process\| of out, dq",
    fault="ring.online_update without the rescale e^(m - m') of the old sums",
)
def test_a_ring_without_its_last_hop_or_rescale_fails(lines: dict) -> None:
    for fault in ("no last hop", "no rescale"):
        for name in (
            "causal zigzag",
            "causal contiguous",
            "full zigzag",
            "full contiguous",
        ):
            assert lines[fault, name].endswith("FAIL"), lines[fault, name]


@pytest.mark.controls(
    "12b_context",
    r"causal (zigzag|contiguous): max \|4 ranks - one process\| of out, dq",
    fault="ring.block_mask's diagonal block masked on the wrong side (keys after)",
)
def test_a_diagonal_masked_on_the_wrong_side_fails(lines: dict) -> None:
    for name in ("causal zigzag", "causal contiguous"):
        assert lines["upper mask", name].endswith("FAIL"), lines["upper mask", name]


@pytest.mark.controls(
    "12b_context",
    r"ring, 8 q heads, [12] K/V: max \|4 ranks - one process\| of out, dq",
    fault="ring.sum_over_group takes a K/V head's gradient from its first q head",
)
def test_a_k_v_gradient_not_summed_over_its_group_fails(lines: dict) -> None:
    for kv_heads in (2, 1):
        assert lines["gqa", kv_heads].endswith("FAIL"), lines["gqa", kv_heads]


@pytest.mark.controls(
    "12b_context",
    r"wire bytes of one call \d+ = the ring's formula",
    fault="ring.send_home left out: one pass of dK, dV fewer on the wire",
)
def test_a_ring_missing_its_last_hop_fails_the_byte_formula(lines: dict) -> None:
    assert lines["wire"].endswith("False"), lines["wire"]


@pytest.mark.controls(
    "12b_context",
    r"Ulysses (causal|full), [48] K/V heads: max \|4 ranks - one process\|",
    fault="ulysses.head_groups deals heads round-robin; the way back takes blocks",
)
def test_ulysses_with_a_wrong_head_split_fails(lines: dict) -> None:
    for kv_heads in (8, 4):
        for causal in (True, False):
            line = lines["ulysses", kv_heads, causal]
            assert line.endswith("FAIL"), line


@pytest.mark.controls(
    "12b_context",
    r"[48] K/V heads: ring attention sends \d+; Ulysses wire bytes of one call \d+",
    fault="ulysses.scatter_heads sends q, k, v in three all_to_alls, not one",
)
def test_ulysses_in_three_messages_fails_the_byte_formula(lines: dict) -> None:
    for kv_heads in (8, 4):
        line = lines["ulysses wire", kv_heads]
        assert line.endswith("False"), line


@pytest.mark.controls(
    "12b_context",
    r"4 K/V heads: a ring rank keeps \d+ bytes for backward; Ulysses \d+, 1/4 of",
    fault="K/V repeated to q's heads before Ulysses (no enable_gqa): 8 kept, not 4",
)
def test_ulysses_with_expanded_k_v_fails_the_memory_formula(lines: dict) -> None:
    assert lines["ulysses kept"].endswith("False"), lines["ulysses kept"]


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
    fault="split.chunk_ids holds the zig-zag pair late chunk first",
)
def test_a_zigzag_pair_in_the_wrong_order_is_not_torchs(lines: dict) -> None:
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
    steps = ("grads", "params")
    faulty = [key for key in lines if isinstance(key, tuple) and key[-1] in steps]
    assert len(faulty) == 4 * 2  # each layout under two faults, grads and params
    for key in faulty:
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
