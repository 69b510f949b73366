"""Ulysses attention on real gloo ranks (2 and 4): equal to one process's SDPA of the
whole sequence (output and q, k, v gradients within 1e-5), causal or not, zig-zag or
contiguous tokens, with all heads or grouped-query K/V; its wire bytes (all_to_alls
counted from their pieces) and the bytes kept for backward equal to their formulas
and to 1/cp of one process's SDPA, beside ring attention's; head counts that cp
does not divide refused before any collective."""

from __future__ import annotations

import pytest
import torch
from spawned import errors_and_sent, on_ranks

from distcourse.parallel import context as cpx
from distcourse.parallel.context import check

SHAPE = (2, 8, 16, 4)  # B, H, T, D: 8 heads split over 2 or 4 ranks
KV_HEADS = [8, 4]  # all heads; grouped-query K/V that cp still divides


def _refusals(cp: int) -> dict[str, str]:
    odd = torch.randn(1, cp + cp // 2, 4, 2)  # 3 heads on 2 ranks, 6 on 4
    q = torch.randn(1, 8, 4, 2)
    kv = torch.randn(1, cp // 2, 4, 2)  # 1 K/V head on 2 ranks, 2 on 4
    cases = {
        "q heads": lambda: cpx.ulysses_attention(odd, odd, odd),
        "kv heads": lambda: cpx.ulysses_attention(q, kv, kv),
        "groups": lambda: cpx.ulysses_attention(q, *[torch.randn(1, 3, 4, 2)] * 2),
    }
    return errors_and_sent(cases)


def _run() -> dict[str, object]:
    torch.set_num_threads(1)
    out: dict[str, object] = {}
    for kv_heads in KV_HEADS:
        for causal in (True, False):
            for layout in cpx.LAYOUTS:
                out[kv_heads, causal, layout] = check.against_full_attention(
                    SHAPE,
                    causal=causal,
                    layout=layout,
                    kv_heads=kv_heads,
                    attention=cpx.ulysses_attention,
                )
        out["cost", kv_heads] = check.ulysses_cost(SHAPE, kv_heads=kv_heads)
    out["refused"] = _refusals(torch.distributed.get_world_size())
    out["timings"] = check.timings((1, 8, 32, 4), repeats=1)
    return out


runs = on_ranks(_run, 2, 4, timeout=60)


@pytest.mark.parametrize("layout", cpx.LAYOUTS)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kv_heads", KV_HEADS)
def test_equal_to_one_process_output_and_gradients(
    runs: list, kv_heads: int, causal: bool, layout: str
) -> None:
    for out in runs:
        diffs = out[kv_heads, causal, layout]
        assert set(diffs) == {"out", "dq", "dk", "dv"}
        assert max(diffs.values()) <= 1e-5, diffs


@pytest.mark.parametrize("kv_heads", KV_HEADS)
def test_bytes_and_memory_equal_their_formulas(runs: list, kv_heads: int) -> None:
    B, H, T, D = SHAPE
    cp = len(runs)
    for out in runs:
        cost = out["cost", kv_heads]
        for what in ("wire", "kept", "share"):
            measured, formula = cost[what]
            assert measured == formula, (what, measured, formula)
        q, kv = (B * h * (T // cp) * D * 4 for h in (H, kv_heads))
        data = 4 * (q + kv) * (cp - 1) // cp  # q, k, v, out and their gradients
        assert cost["wire"][0] == data + 16 * (cp - 1) + 112 * (cp - 1)
        # the same bytes kept as a rank of ring attention
        assert cost["kept"][0] == cpx.saved_bytes_formula(B, H, T, D, cp, 4, kv_heads)
        ring, ulysses = cost["ring"]
        assert ring == cpx.ring_bytes(kv, cp) and ulysses == cost["wire"][0]


def test_ulysses_sends_less_than_the_ring_with_all_heads(runs: list) -> None:
    for out in runs:
        ring, ulysses = out["cost", 8]["ring"]
        assert ulysses < ring


def test_head_counts_cp_does_not_divide_are_refused_before_any_collective(
    runs: list,
) -> None:
    cp = len(runs)
    for out in runs:
        got = out["refused"]
        odd, kv = cp + cp // 2, cp // 2
        assert f"q have {odd} heads, which do not split over cp={cp}" in got["q heads"]
        want = f"k and v have {kv} heads, which do not split over cp={cp}"
        assert want in got["kv heads"]
        assert "grouped-query attention needs k's heads to divide q's" in got["groups"]
        assert got["sent"] == "0"


def test_the_byte_formulas_cross_where_the_text_says() -> None:
    """MHA: Ulysses below the ring from cp = 2; GQA with 4 q heads per K/V head:
    above at cp = 2, below at cp = 4 (cost's docstring)."""
    X = 1000
    for cp in (2, 4, 8):
        assert cpx.ulysses_bytes(X, X, cp, check=False) < cpx.ring_bytes(X, cp)
    assert cpx.ulysses_bytes(4 * X, X, 2, check=False) > cpx.ring_bytes(X, 2)
    assert cpx.ulysses_bytes(4 * X, X, 4, check=False) < cpx.ring_bytes(X, 4)


def test_timings_agree_across_ranks_and_name_the_three_runs(runs: list) -> None:
    got = [out["timings"] for out in runs]
    assert set(got[0]) == {"ring", "ulysses", "one process"}
    assert all(t > 0 for t in got[0].values())
    assert all(g == got[0] for g in got)  # the slowest rank's, on every rank
