"""Context parallelism's local arithmetic, in one process: who holds which chunks
and positions, shard/unshard round trips, and the formulas of bytes, memory and
work per rank (the ranks' measurements are in test_parallel_context_ring.py)."""

from __future__ import annotations

import pytest
import torch

from distcourse.parallel import context as cpx


def test_zigzag_pairs_an_early_chunk_with_a_late_one() -> None:
    assert [cpx.chunk_ids(4, r) for r in range(4)] == [(0, 7), (1, 6), (2, 5), (3, 4)]
    got = [cpx.chunk_ids(4, r, "contiguous") for r in range(4)]
    assert got == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert cpx.positions(8, 2, 0).tolist() == [0, 1, 6, 7]
    assert cpx.positions(8, 2, 1).tolist() == [2, 3, 4, 5]


@pytest.mark.parametrize("layout", cpx.LAYOUTS)
def test_shard_then_unshard_gives_the_sequence_back(layout: str) -> None:
    x = torch.arange(2 * 24).view(2, 24)
    pieces = [cpx.shard(x, 1, 3, r, layout) for r in range(3)]
    assert torch.equal(cpx.unshard(pieces, 1, layout), x)
    for r, piece in enumerate(pieces):
        assert torch.equal(piece[0], cpx.positions(24, 3, r, layout))


def test_work_per_rank_zigzag_balanced_contiguous_not() -> None:
    assert [cpx.work_blocks(4, r) for r in range(4)] == [9, 9, 9, 9]
    assert [cpx.work_blocks(4, r, "contiguous") for r in range(4)] == [3, 7, 11, 15]
    assert cpx.imbalance(4) == 1.0
    assert cpx.imbalance(4, "contiguous") == pytest.approx(15 / 9)
    assert cpx.work_blocks(4, 2, "contiguous", causal=False) == 16
    # every block that is not all masked is computed once, by someone
    for cp in (1, 2, 3, 4):
        for layout in cpx.LAYOUTS:
            total = sum(cpx.work_blocks(cp, r, layout) for r in range(cp))
            assert total == 2 * cp * (2 * cp + 1) // 2


def test_the_block_masks_of_a_causal_ring() -> None:
    assert cpx.block_mask(3, 1, 2, causal=True) is None  # keys before: all seen
    assert cpx.block_mask(1, 3, 2, causal=True) == "skip"  # keys after: none
    assert cpx.block_mask(2, 2, 2, causal=True).tolist() == [[True, False]] * 1 + [
        [True, True]
    ]
    assert cpx.block_mask(1, 3, 2, causal=False) is None


def test_bytes_and_memory_formulas() -> None:
    kv = 2 * 2 * 4 * 4 * 4  # B, H, T / cp, D, fp32
    # forward: 3 passes of K and V; backward 3 of K, V, dK, dV and one of dK, dV
    want = 3 * (2 * kv + 160) + 3 * (4 * kv + 160) + 2 * kv + 160 + 3 * 112
    assert cpx.ring_bytes(kv, 4) == want
    assert cpx.ring_bytes(kv, 4, backward=False, check=False) == 3 * (2 * kv + 160)
    assert cpx.ring_bytes(kv, 1) == 0
    assert cpx.saved_bytes_formula(2, 2, 16, 4, 4) == (4 * 2 * 2 * 4 * 4 + 16) * 4


def test_bad_sequences_and_layouts_are_refused() -> None:
    with pytest.raises(ValueError, match=r"10 tokens does not split into 2 x cp = 4"):
        cpx.check_sequence(10, 2)
    with pytest.raises(ValueError, match="does not split into 2 x cp = 8"):
        cpx.shard(torch.zeros(1, 12), 1, 4, 0)
    with pytest.raises(ValueError, match="layout='ring' is not one of zigzag"):
        cpx.chunk_ids(2, 0, "ring")
    with pytest.raises(ValueError, match="rank=2 is not a rank of a group of cp=2"):
        cpx.chunk_ids(2, 2)
