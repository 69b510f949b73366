"""Negative controls of chapter 12b: its own cells, run with a fault planted in the
context-parallel package, must turn each verdict they print from PASS to FAIL.

The faults replace one function of `ring`, `ulysses`, `split` or `gpt` (or the
attention a check runs by default) for a run of the cells: the last dK/dV hop left
out, the diagonal block masked on the wrong side, the online softmax without its
rescale, a K/V head's gradient not summed over its q heads, Ulysses's head groups
dealt round-robin, its q, k, v sent in three all_to_alls, K/V repeated to q's heads
before it, K and V gathered instead of passed round the ring, the layout argument
ignored, the zig-zag pair held in the wrong order, the cp all-reduce forgotten or the
dp one summed; and the chapter's pitfall cell with its positions right. One spawn of
the chapter's 4 ranks runs them all (tests/controls/harness.py).
"""

from __future__ import annotations

from collections.abc import Callable

import harness
import torch
import torch.distributed as dist
import torch.nn.functional as F
from harness import Fault, Plant, Swap
from torch import Tensor, nn

from distcourse.comm.autograd import all_gather_along, all_to_all_along
from distcourse.mesh import Mesh
from distcourse.parallel import context
from distcourse.parallel.context import check, ring, split, ulysses
from distcourse.parallel.context import gpt as cg

CHAPTER = harness.Chapter("12b_context", setup=["SHAPE = (2, 2, 16, 4)"], stored=True)
RING = "for causal in (True, False):\n    for layout in context.LAYOUTS:\n        diffs"
GQA = "GQA = (2, 8, 16, 4)"  # the cells, by a text of each
COST = "cost = check.wire_and_memory(SHAPE)"
BLOCKS = "blocks, formula = check.wire_and_memory(SHAPE, layout=layout)"
DP_CP = "mesh = cg.make_mesh(2)"
STEP = "cg.train_dp_cp(model, first, mesh)"
TORCH = "theirs = torch_side.shard(x, 2)"
ULYSSES = "HEADS = (2, 8, 16, 4)"
ULYSSES_COST = "cost = check.ulysses_cost(HEADS, kv_heads=kv_heads)"
PITFALL = "class FromZero(cg.ContextGPT):"


def _no_last_hop(ring_: ring.Ring, buf: Tensor) -> tuple[Tensor, Tensor]:
    """The dK/dV sums kept one rank before their owner: the last pass left out."""
    return buf[2].clone(), buf[3].clone()


def _upper_mask(real: Callable) -> Callable:
    """The diagonal block masked on the wrong side: keys at or after the query."""

    def faulty(*args: object, **kw: object) -> Tensor | str | None:
        mask = real(*args, **kw)
        return mask.transpose(-2, -1) if isinstance(mask, Tensor) else mask

    return faulty


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


def ignoring_layout(*args: Tensor, **kw: object) -> Tensor:
    """Ring attention that ignores its layout: the other split's blocks computed."""
    other = {"zigzag": "contiguous", "contiguous": "zigzag"}[str(kw["layout"])]
    return context.ring_attention(*args, **{**kw, "layout": other})


class FromZero(cg.ContextGPT):
    """The chapter's pitfall: every rank numbers its tokens from 0."""

    def token_positions(self, local: int) -> Tensor:
        return torch.arange(local)


FAULTS = {
    "no last hop": Fault([RING, GQA, COST], Plant(ring, "send_home", _no_last_hop)),
    "upper mask": Fault([RING], Plant(ring, "block_mask", _upper_mask, wrap=True)),
    "no rescale": Fault([RING], Plant(ring, "online_update", _no_rescale)),
    "first of group": Fault([GQA], Plant(ring, "sum_over_group", _first_of_group)),
    "gathered": Fault([COST], Plant(check, "ring_attention", _gathered)),
    "layout ignored": Fault([BLOCKS], Plant(check, "ring_attention", ignoring_layout)),
    "only dp": Fault([DP_CP, STEP], Plant(cg, "average_gradients", _only_dp)),
    "summed dp": Fault([DP_CP], Plant(cg, "average_gradients", _summed_dp)),
    "from zero": Fault([DP_CP], Plant(cg, "ContextGPT", FromZero)),
    "pair swapped": Fault([TORCH], Plant(split, "chunk_ids", _swapped_pair)),
    "round robin": Fault([ULYSSES], Plant(ulysses, "head_groups", _round_robin)),
    "three messages": Fault(
        [ULYSSES, ULYSSES_COST], Plant(ulysses, "scatter_heads", _three_messages)
    ),
    "expanded": Fault(
        [ULYSSES, ULYSSES_COST], Plant(check, "ulysses_attention", _expanded)
    ),
    "positions right": Fault(
        [DP_CP, PITFALL],
        Swap(
            "        return torch.arange(local)",
            "        return super().token_positions(local)",
        ),
    ),
}


CONTROLS = harness.Controls(
    "12b_context",
    test_a_ring_without_its_last_hop_fails=harness.Flip(
        ["no last hop"],
        r"(causal|full) (zigzag|contiguous): max \|4 ranks - one process\| of out, dq",
        "ring.send_home left out: the dK/dV sums stay one rank before their owner",
    ),
    test_a_ring_without_its_rescale_fails=harness.Flip(
        ["no rescale"],
        r"(causal|full) (zigzag|contiguous): max \|4 ranks - one process\| of out, dq",
        "ring.online_update without the rescale e^(m - m') of the old sums",
    ),
    test_a_diagonal_masked_on_the_wrong_side_fails=harness.Flip(
        ["upper mask"],
        r"causal (zigzag|contiguous): max \|4 ranks - one process\| of out, dq",
        "ring.block_mask's diagonal block masked on the wrong side (keys after)",
    ),
    test_a_k_v_gradient_not_summed_over_its_group_fails=harness.Flip(
        ["first of group"],
        r"ring, 8 q heads, [12] K/V: max \|4 ranks - one process\| of out, dq",
        "ring.sum_over_group takes a K/V head's gradient from its first q head",
    ),
    test_a_ring_missing_its_last_hop_fails_the_byte_formula=harness.Flip(
        ["no last hop"],
        r"wire bytes of one call \d+ = the ring's formula",
        "ring.send_home left out: one pass of dK, dV fewer on the wire",
    ),
    test_ulysses_with_a_wrong_head_split_fails=harness.Flip(
        ["round robin"],
        r"Ulysses (causal|full), [48] K/V heads: max \|4 ranks - one process\|",
        "ulysses.head_groups deals heads round-robin; the way back takes blocks",
    ),
    test_ulysses_in_three_messages_fails_the_byte_formula=harness.Flip(
        ["three messages"],
        r"[48] K/V heads: ring attention sends \d+; Ulysses wire bytes of one call \d+",
        "ulysses.scatter_heads sends q, k, v in three all_to_alls, not one",
    ),
    test_ulysses_with_expanded_k_v_fails_the_memory_formula=harness.Flip(
        ["expanded"],
        r"4 K/V heads: a ring rank keeps \d+ bytes for backward; Ulysses \d+, 1/4 of",
        "K/V repeated to q's heads before Ulysses (no enable_gqa): 8 kept, not 4",
    ),
    test_gathering_the_sequence_fails_the_memory_checks=harness.Flip(
        ["gathered"],
        r"kept for backward \d+ bytes = formula",
        "K and V all-gathered and attended at once, the whole sequence kept",
        r"one process on SDPA's CPU kernel keeps \d+ bytes; each rank 1/4 of it",
        "K and V all-gathered and attended at once, the whole sequence kept",
    ),
    test_the_other_split_fails_the_block_formula=harness.Flip(
        ["layout ignored"],
        r"(zigzag|contiguous): \d+ blocks computed = formula",
        "the layout argument ignored: the other split's blocks computed",
    ),
    test_a_zigzag_pair_in_the_wrong_order_is_not_torchs=harness.Flip(
        ["pair swapped"],
        r"torch's context_parallel holds the same tokens as our zig-zag",
        "split.chunk_ids holds the zig-zag pair late chunk first",
    ),
    test_faulty_dp_x_cp_fails_against_one_process=harness.Flip(
        ["only dp", "summed dp", "from zero"],
        r"dp x cp 2x2 (zigzag|contiguous): (step-1 gradients|parameters after 3 SGD)",
        "gradients averaged over dp only (no cp all-reduce); summed over dp; "
        "positions counted from 0 on every rank",
    ),
    test_right_positions_do_not_differ=harness.Flip(
        ["positions right"],
        r"positions 0\.\.T/cp-1 on every rank: gradients differ from one process",
        "the pitfall cell's positions right (ContextGPT's own): nothing to see",
    ),
    test_a_step_without_the_cp_all_reduce_fails_the_byte_formula=harness.Flip(
        ["only dp"],
        r"wire bytes of a dp x cp step \d+ = formula",
        "gradients averaged over dp only: the cp all-reduces never sent",
    ),
)
globals().update(CONTROLS.tests())
