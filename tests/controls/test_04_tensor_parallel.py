"""Negative controls for chapter 4: every verdict the chapter prints, run on a planted
fault, must say FAIL (or False). The checks are the chapter's own: the same package
functions (differences, gradient_differences, step_ledger, block_memory, ...) and
the same comparisons, on 2 gloo ranks in one spawn; the two-device check, which needs
no ranks, runs in this process.
"""

from __future__ import annotations

import copy
import os
import shutil
import tempfile

import helpers
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from distcourse import checks
from distcourse.comm import reduce_from_group
from distcourse.examples import models
from distcourse.examples.gpt import (
    MLP,
    Block,
    GPTConfig,
    SelfAttention,
    TinyGPT,
    lm_loss,
    token_batches,
    train_lm,
)
from distcourse.launch import spawn
from distcourse.parallel.tensor import (
    ColumnParallelLinear,
    ParallelMLP,
    ParallelSelfAttention,
    RowParallelLinear,
    VocabParallelEmbedding,
    block_memory,
    differences,
    full_state_dict,
    gradient_differences,
    load_checkpoint,
    parallelize_block,
    parallelize_gpt,
    save_checkpoint,
    step_ledger,
    vocab_parallel_cross_entropy,
)

TOL, B, T, H = 1e-5, 2, 8, 16


def nudged(module: nn.Module, name: str, by: float = 1e-2) -> nn.Module:
    """`module` with the first value of parameter `name` moved by `by` (in place).

    One value, not the whole tensor: a constant added to every weight can vanish
    (a layer norm's output sums to zero over features; softmax ignores a shift
    shared by all logits)."""
    with torch.no_grad():
        dict(module.named_parameters())[name].view(-1)[0] += by
    return module


class MLPWithoutG(ParallelMLP):
    """The row layer keeps its partial sum: no all_reduce in forward."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(F.gelu(self.fc(x)), self.proj.weight) + self.proj.bias


class MLPSummingInDouble(ParallelMLP):
    """g sums the partial outputs in float64: the right numbers, twice the bytes."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(F.gelu(self.fc(x)), self.proj.weight)
        y = reduce_from_group(y.double(), check=False).to(y.dtype)
        return y + self.proj.bias


class SequenceMLPWithAllReduce(ParallelMLP):
    """Sequence parallelism whose g is an all_reduce, then my tokens: right numbers,
    twice the bytes, and no reduce_scatter at all."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, r = dist.get_world_size(), dist.get_rank()
        h = F.gelu(self.fc(x))  # (B, T, 4H / n): the tokens were gathered
        y = F.linear(h, self.proj.weight)
        with torch.no_grad():  # the sum's value; the gradient stays local
            total = y.clone()
            dist.all_reduce(total)
        y = y + (total - y).detach()
        return y.tensor_split(n, 1)[r] + self.proj.bias


def _layers(found: dict[str, str]) -> None:
    """Step 2: a column layer with another rank's rows; a row layer without g."""
    n, r = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(0)
    linear, x = nn.Linear(8, 8), torch.randn(4, 8)
    whole = linear(x)
    col = ColumnParallelLinear.from_linear(linear)
    with torch.no_grad():
        col.weight.copy_(linear.weight.chunk(n, 0)[(r + 1) % n])  # the wrong slice
        col.bias.copy_(linear.bias.chunk(n, 0)[(r + 1) % n])
    row = RowParallelLinear.from_linear(linear, input_is_parallel=False)
    d_col = (col(x) - whole.chunk(n, -1)[r]).abs().max().item()
    partial = F.linear(x.chunk(n, -1)[r], row.weight) + row.bias  # no all_reduce
    d_row = (partial - whole).abs().max().item()
    found["column"] = f"column == my columns of Y {checks.verdict(d_col, 1e-6)}"
    found["row"] = f"row == Y {checks.verdict(d_row, 1e-6)}"


def _blocks(found: dict[str, str]) -> None:
    """Step 4's twins, each with a planted fault, against one process."""
    torch.manual_seed(0)
    mlp, x = MLP(H), torch.randn(B, T, H)
    attn, block = SelfAttention(H, 4), Block(GPTConfig(n_embd=H, n_head=4))
    twins = {
        "MLP": (mlp, MLPWithoutG.from_module(mlp), False),
        "attention": (
            attn,
            nudged(ParallelSelfAttention.from_module(attn), "key.weight"),
            False,
        ),
        "block": (block, nudged(parallelize_block(block), "mlp.fc.bias"), False),
        "block, seq. parallel": (
            block,
            nudged(parallelize_block(block, sequence_parallel=True), "ln2.weight"),
            True,
        ),
    }
    for name, (module, twin, sp) in twins.items():
        got = differences(module, twin, x, sequence_parallel=sp)
        worst = checks.max_over_ranks(max(got.values()))
        found[name] = f"{name} {checks.verdict(worst, TOL)}"


def _vocab(found: dict[str, str]) -> None:
    """The vocabulary-parallel loss with an embedding holding another rank's rows."""
    n, r, V = dist.get_world_size(), dist.get_rank(), 64
    torch.manual_seed(0)
    emb, head = nn.Embedding(V, H), nn.Linear(H, V, bias=False)
    ids, target = (torch.randint(0, V, (B, T)) for _ in range(2))
    loss = F.cross_entropy(head(emb(ids)).flatten(0, 1), target.flatten())
    loss.backward()
    p_emb = VocabParallelEmbedding.from_embedding(emb)
    with torch.no_grad():
        p_emb.weight.copy_(emb.weight.chunk(n, 0)[(r + 1) % n])  # the wrong rows
    p_head = ColumnParallelLinear.from_linear(head)
    p_loss = vocab_parallel_cross_entropy(p_head(p_emb(ids)), target)
    p_loss.backward()
    grads = [
        *gradient_differences(p_emb, emb).values(),
        *gradient_differences(p_head, head).values(),
    ]
    worst = checks.max_over_ranks(max(abs(p_loss.item() - loss.item()), *grads))
    found["vocab"] = f"loss and both gradients {checks.verdict(worst, TOL)}"


def _bytes(found: dict[str, str]) -> None:
    """Step 5: an MLP without g; sequence parallelism fed the whole sequence (its f
    gathers S, not S/N, a rank); sequence parallelism whose g is an all_reduce."""
    n, rank = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(0)
    mlp, x = MLP(H), torch.randn(B, T, H)
    block = Block(GPTConfig(n_embd=H, n_head=4))
    S = B * T * H * 4
    for name, twin, sublayers in (
        ("mlp bytes", MLPWithoutG.from_module(mlp, check=False), 1),
        ("block bytes", parallelize_block(block, check=False), 2),
    ):
        if name == "block bytes":
            twin.mlp = MLPSummingInDouble.from_module(block.mlp, check=False)
        ledger = step_ledger(twin, x)
        sizes = [r.bytes for r in ledger.records if r.op == "all_reduce"]
        found[name] = f"... as the shapes say: {sizes == [S] * 2 * sublayers}"
    sp = SequenceMLPWithAllReduce.from_module(mlp, sequence_parallel=True, check=False)
    ledger = step_ledger(sp, x.tensor_split(n, 1)[rank])
    scatters = ledger.bytes_sent("batch_isend_irecv")
    one_way = 2 * ((n - 1) * S // n)
    found["scatters"] = f"reduce_scatters ...: {scatters == one_way}"
    whole = ParallelMLP.from_module(mlp, sequence_parallel=True)  # not split first
    fed = step_ledger(whole, x)
    gathers = [r for r in fed.records if r.op == "all_gather" and r.bytes == S // n]
    found["gathers"] = f"all_gathers (f): ... bytes: {len(gathers) == 2}"


def _memory(found: dict[str, str]) -> None:
    """Step 5's activation memory: a block that keeps more, an MLP left whole,
    sequence parallelism that never gathers the tokens."""
    torch.manual_seed(0)
    block, x = Block(GPTConfig(n_embd=H, n_head=4)), torch.randn(B, T, H)
    extra = copy.deepcopy(block)
    extra.mlp = nn.Sequential(extra.mlp, nn.LayerNorm(H))  # saves its input too
    unsplit = parallelize_block(block)
    unsplit.mlp = copy.deepcopy(block.mlp)
    no_gather = parallelize_block(block)  # fed my tokens: nothing gathers them
    for name, twin, of, sp in (
        ("one process", extra, extra, False),
        ("TP", unsplit, block, False),
        ("TP + SP", no_gather, block, True),
    ):
        measured, formula = block_memory(of, twin, x, sequence_parallel=sp)
        same = checks.max_over_ranks(float(measured != formula)) == 0
        found[f"memory {name}"] = f"== formula on every rank: {same}"


def _dtensor(found: dict[str, str]) -> None:
    """Step 6: ours against parallelize_module, ours with a nudged weight."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        loss_parallel,
        parallelize_module,
    )

    n, rank = dist.get_world_size(), dist.get_rank()
    world = init_device_mesh("cpu", (n,))
    torch.manual_seed(0)
    mlp, x = MLP(H), torch.randn(B, T, H)
    block = Block(GPTConfig(n_embd=H, n_head=4))
    plan = {"fc": ColwiseParallel(), "proj": RowwiseParallel()}
    theirs = parallelize_module(copy.deepcopy(mlp), world, plan)
    ours = nudged(ParallelMLP.from_module(mlp), "proj.weight")
    y_ours, y_theirs = ours(x), theirs(x)
    (y_ours.square().sum() + y_theirs.square().sum()).backward()
    diffs = [
        (y_ours - y_theirs).abs().max().item(),
        *gradient_differences(ours, theirs).values(),
    ]
    worst = checks.max_over_ranks(max(diffs))
    found["dtensor mlp"] = f"MLP, output and 4 gradients {checks.verdict(worst, TOL)}"

    sp_plan = helpers.torch_sequence_parallel_plan()
    theirs = parallelize_module(copy.deepcopy(block), world, sp_plan)
    ours = nudged(parallelize_block(block, sequence_parallel=True), "ln1.bias")
    mine = x.tensor_split(n, 1)[rank]
    y_ours, y_theirs = ours(mine), theirs(mine)
    (y_ours.square().sum() + y_theirs.square().sum()).backward()
    diffs = [
        (y_ours - y_theirs).abs().max().item(),
        *gradient_differences(ours, theirs).values(),
    ]
    worst = checks.max_over_ranks(max(diffs))
    found["dtensor sp"] = f"sequence-parallel block {checks.verdict(worst, TOL)}"

    V = 64
    emb, head = nn.Embedding(V, H), nn.Linear(H, V, bias=False)
    ids, target = (torch.randint(0, V, (B, T)) for _ in range(2))
    p_emb = VocabParallelEmbedding.from_embedding(emb)
    p_head = nudged(ColumnParallelLinear.from_linear(head), "weight")
    p_loss = vocab_parallel_cross_entropy(p_head(p_emb(ids)), target)
    p_loss.backward()
    vocab_plan = {
        "0": RowwiseParallel(input_layouts=Replicate()),
        "1": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False),
    }
    lm = parallelize_module(nn.Sequential(emb, head), world, vocab_plan)
    with loss_parallel():
        their_loss = F.cross_entropy(lm(ids).flatten(0, 1), target.flatten())
        their_loss.backward()
    diffs = [
        abs(p_loss.item() - their_loss.full_tensor().item()),
        *gradient_differences(p_emb, lm[0]).values(),
        *gradient_differences(p_head, lm[1]).values(),
    ]
    worst = checks.max_over_ranks(max(diffs))
    found["loss_parallel"] = f"loss and gradients {checks.verdict(worst, TOL)}"


def _gpt(found: dict[str, str]) -> None:
    """Steps 7 and 8: training with a nudged weight; a checkpoint loaded, then one
    parameter nudged."""
    batches = token_batches(3, 8)
    torch.manual_seed(0)
    gpt = TinyGPT()
    alone = train_lm(copy.deepcopy(gpt), batches)
    tp = nudged(parallelize_gpt(gpt), "blocks.0.mlp.fc.bias", 0.5)
    got = train_lm(tp, batches, vocab_parallel_cross_entropy)
    worst = max(abs(a - b) for a, b in zip(alone, got, strict=True))
    found["training"] = f"every loss {checks.verdict(worst, 1e-4)}"

    path = os.path.join(tempfile.gettempdir(), f"distcourse_ctl4_{os.getppid()}.pt")
    save_checkpoint(parallelize_gpt(gpt), path)
    torch.manual_seed(123)
    loaded, on_one = parallelize_gpt(TinyGPT()), TinyGPT()
    load_checkpoint(loaded, path)
    saved = torch.load(path, weights_only=True)
    on_one.load_state_dict(saved)
    nudged(loaded, "ln_f.bias", 1e-1)  # the planted fault
    same = all(torch.equal(v, saved[k]) for k, v in full_state_dict(loaded).items())
    found["loaded"] = f"every parameter equal to the saved one: {same}"
    probe = token_batches(1, 2, seed=7)[0][0]
    with torch.no_grad():
        n, r = dist.get_world_size(), dist.get_rank()
        d = (loaded(probe) - on_one(probe).chunk(n, -1)[r]).abs().max().item()
    found["logits"] = f"on N == on 1 {checks.verdict(checks.max_over_ranks(d), 1e-5)}"
    dist.barrier()
    if dist.get_rank() == 0:
        os.remove(path)


def _all_faults() -> dict[str, str]:
    """Every planted fault of the chapter on this rank: name -> printed verdict."""
    torch.set_num_threads(1)
    found: dict[str, str] = {}
    for part in (_layers, _blocks, _vocab, _bytes, _memory, _dtensor, _gpt):
        part(found)
    return found


@pytest.fixture(scope="module")
def faults() -> dict[str, str]:
    """What rank 0 printed for each planted fault (one spawn for the chapter)."""
    return spawn(_all_faults, 2, timeout=60)[0]


def _fails(line: str) -> bool:
    return line.endswith(("FAIL", ": False"))


@pytest.mark.controls(
    "04_tensor_parallel",
    r"max \|two devices - one device\|",
    fault="net2 of the two-device model (one value) nudged by 1e-3",
    printed_on="2 GPUs",
)
def test_two_devices_with_a_nudged_layer_fail() -> None:
    torch.manual_seed(0)
    one = models.toy_mlp()
    torch.manual_seed(0)
    split = models.TwoDeviceToyModel("cpu", "cpu")
    nudged(split, "net2.bias", 1e-3)
    x = torch.randn(20, 10)
    diff = (split(x).cpu() - one(x)).abs().max().item()
    assert _fails(f"max |two devices - one device| {checks.verdict(diff, 1e-6)}")


@pytest.mark.controls(
    "04_tensor_parallel",
    r"column == my columns of Y .*; row == Y",
    fault="a column layer holding another rank's rows",
)
def test_column_layer_with_the_wrong_slice_fails(faults: dict[str, str]) -> None:
    assert _fails(faults["column"]), faults["column"]


@pytest.mark.controls(
    "04_tensor_parallel",
    r"column == my columns of Y .*; row == Y",
    fault="a row-parallel layer missing its all_reduce",
)
def test_row_layer_without_its_all_reduce_fails(faults: dict[str, str]) -> None:
    assert _fails(faults["row"]), faults["row"]


@pytest.mark.controls(
    "04_tensor_parallel",
    r"MLP\s+output, input grad, \d+ parameter grads",
    fault="a parallel MLP whose row layer skips g (no all_reduce forward)",
)
@pytest.mark.controls(
    "04_tensor_parallel",
    r"attention\s+output, input grad, \d+ parameter grads",
    fault="a parallel attention with key.weight (one value) nudged by 1e-2",
)
@pytest.mark.controls(
    "04_tensor_parallel",
    r"block\s+output, input grad, \d+ parameter grads",
    fault="a parallel block with mlp.fc.bias (one value) nudged by 1e-2",
)
@pytest.mark.controls(
    "04_tensor_parallel",
    r"block, seq\. parallel\s+output, input grad",
    fault="a sequence-parallel block with ln2.weight (one value) nudged by 1e-2",
)
def test_broken_twins_of_step_4_fail(faults: dict[str, str]) -> None:
    for name in ("MLP", "attention", "block", "block, seq. parallel"):
        assert _fails(faults[name]), faults[name]


@pytest.mark.controls(
    "04_tensor_parallel",
    r"loss and both gradients",
    fault="a vocabulary-parallel embedding holding another rank's rows",
)
def test_vocab_embedding_with_the_wrong_rows_fails(faults: dict[str, str]) -> None:
    assert _fails(faults["vocab"]), faults["vocab"]


@pytest.mark.controls(
    "04_tensor_parallel",
    r"MLP: on the wire .* as the shapes say",
    fault="a parallel MLP whose row layer skips its all_reduce",
)
@pytest.mark.controls(
    "04_tensor_parallel",
    r"block: on the wire .* as the shapes say",
    fault="a parallel block whose MLP sums its partial outputs in float64",
)
def test_ledger_against_broken_layers_or_formula_fails(
    faults: dict[str, str],
) -> None:
    for name in ("mlp bytes", "block bytes"):
        assert _fails(faults[name]), faults[name]


@pytest.mark.controls(
    "04_tensor_parallel",
    r"all_gathers \(f\): \d+, each handed my S/N",
    fault="sequence parallelism fed the whole sequence on every rank (f gathers S)",
)
@pytest.mark.controls(
    "04_tensor_parallel",
    r"reduce_scatters \(g\) sent",
    fault="sequence parallelism whose g is an all_reduce, not a reduce_scatter",
)
def test_sequence_parallel_bytes_of_a_wrong_g_fail(faults: dict[str, str]) -> None:
    for name in ("gathers", "scatters"):
        assert _fails(faults[name]), faults[name]


@pytest.mark.controls(
    "04_tensor_parallel",
    r"one process .*== formula on every rank",
    fault="a block whose MLP is followed by one more LayerNorm",
)
@pytest.mark.controls(
    "04_tensor_parallel",
    r"TP=\d+\s+ln1 .*== formula on every rank",
    fault="a tensor-parallel block whose MLP was left whole",
)
@pytest.mark.controls(
    "04_tensor_parallel",
    r"TP=\d+ \+ SP .*== formula on every rank",
    fault="sequence parallelism that never gathers the tokens",
)
def test_activation_memory_of_other_blocks_fails(faults: dict[str, str]) -> None:
    for name in ("one process", "TP", "TP + SP"):
        assert _fails(faults[f"memory {name}"]), faults[f"memory {name}"]


@pytest.mark.controls(
    "04_tensor_parallel",
    r"MLP, output and 4 gradients",
    fault="our MLP with proj.weight (one value) nudged by 1e-2",
)
@pytest.mark.controls(
    "04_tensor_parallel",
    r"sequence-parallel block, output and \d+ gradients",
    fault="our sequence-parallel block with ln1.bias (one value) nudged by 1e-2",
)
@pytest.mark.controls(
    "04_tensor_parallel",
    r"loss_parallel [\d.]+; loss and gradients",
    fault="our vocabulary-parallel head with its weight (one value) nudged by 1e-2",
)
def test_against_parallelize_module_nudged_fails(faults: dict[str, str]) -> None:
    for name in ("dtensor mlp", "dtensor sp", "loss_parallel"):
        assert _fails(faults[name]), faults[name]


@pytest.mark.controls(
    "04_tensor_parallel",
    r"TP=2: .*every loss",
    fault="a split TinyGPT with one MLP bias value nudged by 0.5",
)
@pytest.mark.controls(
    "04_tensor_parallel",
    r"TP=4: .*every loss",
    fault="a split TinyGPT with one MLP bias value nudged by 0.5",
)
def test_training_a_nudged_split_model_fails(faults: dict[str, str]) -> None:
    assert _fails(faults["training"]), faults["training"]


@pytest.mark.controls(
    "04_tensor_parallel",
    r"every parameter equal to the saved one",
    fault="a checkpoint loaded with one parameter nudged",
)
@pytest.mark.controls(
    "04_tensor_parallel",
    r"logits on 1 == the saved TP=2 model's",
    fault="a checkpoint loaded with one parameter nudged",
)
def test_a_nudged_checkpoint_fails(faults: dict[str, str]) -> None:
    for name in ("loaded", "logits"):
        assert _fails(faults[name]), faults[name]


def _load_after_a_failed_save(fresh: bool) -> str:
    """Step 8's checkpoint with its save planted away, an earlier run's file left at
    the old fixed path: the chapter's fresh directory (`fresh`) finds no file, the
    old fixed path loads the stale one without a word."""
    rank = dist.get_rank()
    old = os.path.join(tempfile.gettempdir(), f"distcourse_stale_{os.getppid()}")
    if rank == 0:
        os.makedirs(old, exist_ok=True)
        torch.save({"w": torch.zeros(1)}, os.path.join(old, "tp2.pt"))  # earlier run's
    folder = [tempfile.mkdtemp(prefix="distcourse-") if rank == 0 else None]
    dist.broadcast_object_list(folder, src=0)  # as the chapter's cell does
    path = os.path.join(folder[0] if fresh else old, "tp2.pt")
    dist.barrier()  # the planted fault: nobody saved
    try:
        torch.load(path, weights_only=True)
        seen = "loaded a stale file"
    except FileNotFoundError:
        seen = "no file: the failed save is seen"
    dist.barrier()
    if rank == 0:
        for gone in (old, folder[0]):
            shutil.rmtree(gone)
    return seen


def test_a_failed_save_is_seen_in_a_fresh_directory() -> None:
    assert (
        spawn(_load_after_a_failed_save, 2, True)
        == ["no file: the failed save is seen"] * 2
    )
    assert spawn(_load_after_a_failed_save, 2, False) == ["loaded a stale file"] * 2


def _doubled(model: nn.Module) -> nn.Module:
    """The planted fault: every gradient twice its size (a sum over a group of 2
    where a mean belongs)."""
    for p in model.parameters():
        p.register_hook(lambda g: 2 * g)
    return model


def _scale_blind() -> dict[str, str]:
    """Step 7's three checks on a split model whose gradients are doubled."""
    batches = token_batches(20, 8)
    torch.manual_seed(0)
    gpt = TinyGPT()
    x, y = batches[0]
    one, split = copy.deepcopy(gpt), _doubled(parallelize_gpt(gpt))
    lm_loss(one(x), y).backward()
    vocab_parallel_cross_entropy(split(x), y).backward()
    worst = checks.max_over_ranks(max(gradient_differences(split, one).values()))
    found = {"gradients": checks.verdict(worst, 1e-5)}
    for name, options, tol in (
        ("SGD", dict(lr=0.1, optimizer_class=torch.optim.SGD), 1e-5),
        ("AdamW", {}, 1e-4),
    ):
        alone = train_lm(copy.deepcopy(gpt), batches, **options)
        split = _doubled(parallelize_gpt(gpt))
        got = train_lm(split, batches, vocab_parallel_cross_entropy, **options)
        worst = max(abs(a - b) for a, b in zip(alone, got, strict=True))
        found[name] = checks.verdict(worst, tol)
    return found


@pytest.mark.controls(
    "04_tensor_parallel",
    r"TP=4 step-1 gradients vs one process",
    fault="every gradient of the split TinyGPT doubled (a sum where a mean belongs)",
)
@pytest.mark.controls(
    "04_tensor_parallel",
    r"TP=4 with SGD: .*every loss",
    fault="every gradient of the split TinyGPT doubled (a sum where a mean belongs)",
)
def test_doubled_gradients_fail_the_gradient_and_sgd_checks_not_adamws() -> None:
    for found in spawn(_scale_blind, 2):
        assert found["gradients"].endswith("FAIL"), found
        assert found["SGD"].endswith("FAIL"), found
        assert found["AdamW"].endswith("PASS"), found  # why step 7 adds the others
