"""Ring attention on real gloo ranks (2 and 4): equal to one process's attention
(output and the gradients of q, k, v within 1e-5, fp32), causal or not, zig-zag or
contiguous, and with grouped-query K/V (4 and 2 heads for 8 of q; SDPA's
enable_gqa); the ledger's wire bytes, the bytes kept for backward and the blocks
computed equal to their formulas; torch's context_parallel cuts the sequence as our
zig-zag does (its attention needs CUDA kernels); bad input refused before any
collective."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from spawned import assert_says, error_of, errors_and_sent, on_ranks

from distcourse.parallel import context as cpx
from distcourse.parallel.context import check, torch_side

SHAPE = (2, 2, 16, 4)  # B, H, T, D
GQA = (2, 8, 16, 4)  # 8 heads of q; K/V with 4 (GQA) or 1 (MQA)


def _refusals() -> dict[str, str]:
    """How each bad call ended, and whether anything was sent before it did."""
    q = torch.randn(1, 4, 4, 2)
    cases = {
        "heads": lambda: cpx.ring_attention(q, *[torch.randn(1, 3, 4, 2)] * 2),
        "k not v": lambda: cpx.ring_attention(q, torch.randn(1, 2, 4, 2), q),
        "odd": lambda: cpx.ring_attention(*[torch.randn(1, 2, 3, 2)] * 3),
        "layout": lambda: cpx.ring_attention(q, q, q, layout="spiral"),
        "3-d": lambda: cpx.ring_attention(q[0], q[0], q[0]),
    }
    got = errors_and_sent(cases)
    mine = torch.randn(1, 2, 4 + 2 * dist.get_rank(), 2)  # ranks disagree on L
    got["disagree"] = error_of(lambda: cpx.ring_attention(mine, mine, mine))
    return got


def _run() -> dict[str, object]:
    torch.set_num_threads(1)
    out: dict[str, object] = {}
    for causal in (True, False):
        for layout in cpx.LAYOUTS:
            out[causal, layout] = check.against_full_attention(
                SHAPE, causal=causal, layout=layout
            )
            out["cost", causal, layout] = check.wire_and_memory(
                SHAPE, causal=causal, layout=layout
            )
    for kv_heads in (4, 1):
        for causal in (True, False):
            out["gqa", kv_heads, causal] = check.against_full_attention(
                GQA, causal=causal, kv_heads=kv_heads
            )
        out["gqa cost", kv_heads] = check.wire_and_memory(GQA, kv_heads=kv_heads)
    x = torch.arange(16.0).view(1, 1, 16, 1)
    rank, cp = dist.get_rank(), dist.get_world_size()
    out["torch shard"] = torch.equal(torch_side.shard(x, 2), cpx.shard(x, 2, cp, rank))
    out["torch attention"] = torch_side.attention(*check.inputs(SHAPE)[:3])
    out["refused"] = _refusals()
    return out


runs = on_ranks(_run, 2, 4, timeout=60)


@pytest.mark.parametrize("layout", cpx.LAYOUTS)
@pytest.mark.parametrize("causal", [True, False])
def test_equal_to_one_process_output_and_gradients(
    runs: list, causal: bool, layout: str
) -> None:
    for out in runs:
        diffs = out[causal, layout]
        assert set(diffs) == {"out", "dq", "dk", "dv"}
        assert max(diffs.values()) <= 1e-5, diffs


@pytest.mark.parametrize("layout", cpx.LAYOUTS)
@pytest.mark.parametrize("causal", [True, False])
def test_bytes_memory_and_blocks_equal_their_formulas(
    runs: list, causal: bool, layout: str
) -> None:
    blocks = []
    for out in runs:
        cost = out["cost", causal, layout]
        for what, (measured, formula) in cost.items():
            assert measured == formula, (what, measured, formula)
        blocks.append(cost["blocks"][0])
    cp = len(runs)
    if causal and layout == "contiguous":  # the last rank does the most
        assert blocks == [4 * r + 3 for r in range(cp)]
    else:
        assert len(set(blocks)) == 1


@pytest.mark.parametrize("kv_heads", [4, 1])
@pytest.mark.parametrize("causal", [True, False])
def test_grouped_query_attention_equals_sdpa_with_enable_gqa(
    runs: list, causal: bool, kv_heads: int
) -> None:
    for out in runs:
        diffs = out["gqa", kv_heads, causal]
        assert max(diffs.values()) <= 1e-5, diffs


@pytest.mark.parametrize("kv_heads", [4, 1])
def test_grouped_query_k_v_send_and_keep_fewer_bytes(runs: list, kv_heads: int) -> None:
    B, H, T, D = GQA
    cp = len(runs)
    for out in runs:
        cost = out["gqa cost", kv_heads]
        for what, (measured, formula) in cost.items():
            assert measured == formula, (what, measured, formula)
        kv = B * kv_heads * (T // cp) * D * 4  # only K/V's own heads travel
        assert cost["wire"][0] == cpx.ring_bytes(kv, cp)


def test_torch_cuts_as_zigzag_and_its_attention_needs_cuda(runs: list) -> None:
    for out in runs:
        assert out["torch shard"] is True
        assert str(out["torch attention"]).startswith("NotImplementedError")
        assert "flash_attention_for_cpu" in str(out["torch attention"])


REFUSED = {  # a bad call of _run's "refused" -> the words of its error
    "heads": (
        "q has 4 heads but k and v have 3",
        "grouped-query attention needs k's heads to divide q's",
    ),
    "k not v": "v is torch.float32[1, 4, 4, 2]",
    "odd": "does not split into 2 x cp",
    "layout": "layout='spiral'",
    "3-d": "must be (B, H, L, D)",
    "disagree": "ranks disagree on shape",
}


def test_bad_input_is_refused_before_any_collective(runs: list) -> None:
    for out in runs:
        assert out["refused"]["sent"] == "0"
        assert_says(out["refused"], REFUSED)
