"""The dropless MoE on real gloo ranks: split over 2 and 4 ranks it gives one
process's outputs, loss, gradients and balancing bias (sigmoid and softmax, top-1
and top-2, shared experts, a skewed gate), serves every assignment, and the
ledger's bytes equal the rows the one process's routing of the whole batch sends
between ranks. In one process: the grouped matmul equals a loop over the blocks,
the bias chooses and never weighs, and its update evens out the load. Bad input
is refused on every rank before any message. tests/controls/test_12_experts.py
plants faults under the same checks."""

from __future__ import annotations

import torch
import torch.distributed as dist
from helpers import refused_alike
from spawned import on_ranks, refused_before_any_group

from distcourse.launch import spawn
from distcourse.parallel import experts
from distcourse.parallel.experts import cost

CASES = {
    "top2 sigmoid shared": dict(top_k=2),
    "top1 softmax skewed": dict(top_k=1, score="softmax", n_shared=0, skew=6.0),
    "top2 sigmoid balanced": dict(top_k=2, balance_rate=1e-2, steps=3, skew=6.0),
}


def _layers() -> dict[str, dict]:
    torch.set_num_threads(1)
    return {
        name: experts.dropless_against_one_process(**kw) for name, kw in CASES.items()
    }


runs = on_ranks(_layers, 2, 4, timeout=120)


def test_dropless_equals_one_process(runs: list[dict[str, dict]]) -> None:
    for found in runs:
        for name, r in found.items():
            lines = experts.dropless_lines(r)
            assert all(ln.endswith(("PASS", "True")) for ln in lines), (name, lines)
            assert r["grad_diff"] <= 1e-5 and r["out_diff"] <= 1e-5
            assert sum(r["load"]) == r["assignments"]  # nothing dropped
    balanced = runs[0]["top2 sigmoid balanced"]
    assert experts.dropless_lines(balanced)[3].startswith("dropless MoE balancing")
    assert any(b != 0 for b in balanced["bias"])  # the bias did move


def test_counts_are_uneven_and_bytes_add_up(runs: list[dict[str, dict]]) -> None:
    n = len(runs)
    skewed = [found["top1 softmax skewed"] for found in runs]
    assert skewed[0]["load"][0] == skewed[0]["assignments"]  # all to expert 0
    matrix = skewed[0]["matrix"]
    assert all(row[0] == 16 and sum(row) == 16 for row in matrix)
    for rank, r in enumerate(skewed):
        assert r["bytes"] == cost.routed_bytes(matrix, rank, 8, 16 * 4)
        assert r["matrix"] == matrix  # every rank counts the same batch
    counts = 8 * 8 * (n - 1) // n  # 8 experts' int64 counts, even
    assert skewed[1]["bytes"] == counts + 2 * 16 * 16 * 4  # sends all 16 away


def test_grouped_matmul_equals_a_loop() -> None:
    torch.manual_seed(0)
    x, w = torch.randn(10, 16), torch.randn(3, 16, 32)
    offs = torch.tensor([3, 3, 10], dtype=torch.int32)  # expert 1 gets nothing
    want = torch.cat([x[:3] @ w[0], x[3:] @ w[2]])
    assert experts.dropless._grouped_runs(x, w)  # torch's kernel, here
    assert torch.allclose(experts.grouped_mm(x, w, offs), want, atol=1e-6)
    odd = torch.randn(10, 5), torch.randn(3, 5, 7)  # rows of 20 bytes: the loop
    assert not experts.dropless._grouped_runs(*odd)
    got = experts.grouped_mm(*odd, offs)
    assert torch.allclose(
        got, torch.cat([odd[0][:3] @ odd[1][0], odd[0][3:] @ odd[1][2]])
    )


def test_the_bias_chooses_and_never_weighs() -> None:
    torch.manual_seed(0)
    moe = experts.DroplessMoE(16, 4, top_k=1, score="sigmoid", balance_rate=0.1)
    x = torch.randn(8, 16)
    moe.bias[3] = 10.0  # every token now picks expert 3
    moe(x)
    assert moe.expert.tolist() == [3] * 8
    assert torch.equal(moe.weight, moe.gate(x).sigmoid()[:, 3].detach())


def test_the_bias_update_follows_the_load() -> None:
    moe = experts.DroplessMoE(8, 4, balance_rate=0.1)
    moe.update_bias(torch.tensor([4, 0, 2, 2]))
    assert torch.allclose(moe.bias, torch.tensor([-0.1, 0.1, 0.0, 0.0]))
    torch.manual_seed(0)
    skewed = experts.DroplessMoE(16, 4, score="sigmoid", balance_rate=0.05)
    with torch.no_grad():
        skewed.gate.weight[0] += 0.5
    x = torch.randn(64, 16) + 1.0
    first = None
    for _ in range(40):
        skewed(x)
        first = skewed.load.max().item() if first is None else first
        skewed.balance()
    assert first == 64 and skewed.load.max().item() <= 32  # from 4x to <= 2x even


def _bad_input() -> list[str]:
    return refused_before_any_group(
        {
            "experts": lambda: experts.shard_dropless(experts.DroplessMoE(8, 3), None),
            "score": lambda: experts.DroplessMoE(8, 4, score="relu"),
            "shared": lambda: experts.DroplessMoE(8, 4, n_shared=-1),
        }
    )


def test_bad_input_is_refused_on_every_rank() -> None:
    assert refused_alike(_bad_input) == [
        "experts: n_experts=3 is not divisible by ep size 2",
        "score: score must be one of ('softmax', 'sigmoid'), got 'relu'",
        "shared: n_shared must be 0 or more, got -1",
    ]


def test_the_formula_counts_rows_from_the_routing() -> None:
    # tokens 0, 1 live on rank 0, tokens 2, 3 on rank 1; experts 0, 1 on rank 0
    m = cost.dispatch_matrix([0, 3, 1, 2], [0, 1, 2, 3], 2, 2, 2)
    assert m == [[1, 1], [1, 1]]
    assert cost.routed_bytes(m, 0, 4, 64) == 8 * 4 // 2 + 2 * (1 + 1) * 64
    # worst case: every token of 4 ranks, k of them on this rank's 2 experts
    assert cost.dropless_buffers(16, 16, 8, 2, 4) == 2 * (2 * 16 * 4) * 16 * 4
    assert cost.dropless_buffers(16, 16, 8, 4, 4) == 2 * (2 * 16 * 4) * 16 * 4
    capped = cost.memory_per_rank(16, 16, 8, 2, 1.25, 4)["buffers"]
    assert capped == 2 * (5 * 4 * 2) * 16 * 4  # capacity 5 x 4 groups x 2 experts


def test_the_grouped_matmul_runs_on_an_accelerator() -> None:
    """On the emulated GPU the grouped path runs (torch's kernel, no host sync for
    the blocks' sizes); a width it refuses takes the loop, which syncs once."""
    from distcourse import emulate

    emulate.setup()
    gpu = torch.device(emulate.DEVICE_TYPE, 0)
    torch.manual_seed(0)
    x, w = torch.randn(10, 16).to(gpu), torch.randn(3, 16, 32).to(gpu)
    offs = torch.tensor([3, 3, 10], dtype=torch.int32).to(gpu)
    before = emulate.host_syncs()
    got = experts.grouped_mm(x, w, offs)
    assert emulate.host_syncs() == before  # grouped: no sizes read on the host
    want = torch.cat([x[:3] @ w[0], x[3:] @ w[2]])
    assert torch.allclose(got.cpu(), want.cpu(), atol=1e-6)
    odd = torch.randn(10, 5).to(gpu), torch.randn(3, 5, 7).to(gpu)
    experts.grouped_mm(*odd, offs)
    assert emulate.host_syncs() > before  # the loop: offs.tolist() waits


def _biases(dp_wide: bool) -> list[float]:
    """dp x ep = 2 x 2: each rank routes its own tokens; the bias after a balance,
    the load summed over all four ranks (dp_wide) or over the ep pair only."""
    from distcourse.mesh import Mesh

    mesh = Mesh((2, 2), ("dp", "ep"))
    torch.manual_seed(0)
    moe = experts.DroplessMoE(16, 4, top_k=1, score="sigmoid", balance_rate=0.1)
    wide = dist.group.WORLD if dp_wide else None
    experts.shard_dropless(moe, mesh.group("ep"), data_parallel=wide)
    torch.manual_seed(1 + mesh.coordinate["dp"])  # each replica its own data
    x = torch.randn(8, 16) + 2.0 * mesh.coordinate["dp"]
    with torch.no_grad():
        moe(x[mesh.coordinate["ep"] * 4 :][:4])
    moe.balance()
    return moe.bias.tolist()


def test_the_bias_balance_reduces_over_the_data_parallel_mesh() -> None:
    """torchtitan sums the tokens per expert over the whole data-parallel mesh, so
    every replica keeps one bias; over the ep group alone (the control) the two dp
    replicas' biases part."""
    wide = spawn(_biases, 4, True, timeout=60)
    assert all(b == wide[0] for b in wide), wide
    narrow = spawn(_biases, 4, False, timeout=60)
    assert narrow[0] == narrow[1] and narrow[0] != narrow[2], narrow
