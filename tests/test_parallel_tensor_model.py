"""A whole TinyGPT split across ranks: trains to the same losses as one process, and
its checkpoint, saved from 2 ranks, loads on 4 and on 1 (and a wrong one is refused).
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from spawned import error_of

from distcourse.examples.gpt import GPTConfig, TinyGPT, token_batches, train_lm
from distcourse.launch import spawn
from distcourse.parallel.tensor import (
    full_state_dict,
    load_checkpoint,
    parallelize_gpt,
    save_checkpoint,
    vocab_parallel_cross_entropy,
)

CFG = GPTConfig()  # vocab 64, 2 layers, 4 heads, 32 wide
STEPS = 20
LOSS_TOL = 1e-4  # AdamW amplifies rounding a little; still 4 decimals
PARAM_TOL = 1e-4  # 20 AdamW steps of lr 1e-2: measured 4e-5


def _train(sp: bool) -> tuple[list[float], list[float], float]:
    """(one-process losses, tensor-parallel losses, max parameter difference)."""
    batches = token_batches(STEPS, 8, CFG)
    torch.manual_seed(0)
    model = TinyGPT(CFG)
    twin = parallelize_gpt(model, sequence_parallel=sp)  # a copy, split
    losses = train_lm(model, batches)
    tp_losses = train_lm(twin, batches, vocab_parallel_cross_entropy)
    trained = full_state_dict(twin)
    # a key's bias adds q.b to every score of a query: softmax ignores it, so its
    # true gradient is 0 and both runs hold rounding noise there, which AdamW
    # divides by its own square root: lr-sized steps of noise. Skip it.
    diff = max(
        (trained[k] - v).abs().max().item()
        for k, v in model.state_dict().items()
        if not k.endswith("key.bias")
    )
    return losses, tp_losses, diff


@pytest.mark.parametrize(
    "world_size, sp", [(2, False), (2, True), (4, False)], ids=["2", "2-sp", "4"]
)
def test_tiny_gpt_trains_to_one_process_losses(world_size: int, sp: bool) -> None:
    for losses, tp_losses, diff in spawn(_train, world_size, sp, timeout=30):
        assert losses[-1] < losses[0] - 1  # it learns
        assert max(abs(a - b) for a, b in zip(losses, tp_losses, strict=True)) <= (
            LOSS_TOL
        ), (losses, tp_losses)
        assert diff <= PARAM_TOL, diff


def _devices(sp: bool) -> list[str]:
    """Devices of a split copy of a TinyGPT built on "meta": where its parts land."""
    with torch.device("meta"):
        model = TinyGPT(CFG)
    twin = parallelize_gpt(model, sequence_parallel=sp, check=False)
    return sorted({t.device.type for t in (*twin.parameters(), *twin.buffers())})


@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp+sp"])
def test_split_layers_stay_on_the_models_device(sp: bool) -> None:
    # a GPU rank hands over a model on cuda:r; no split layer may fall back to the
    # host (its collectives would then get CPU tensors: NCCL refuses them). "meta"
    # stands in for the GPU here: any layer built on the host shows up as "cpu"
    for found in spawn(_devices, 2, sp, timeout=30):
        assert found == ["meta"], found


def _save(path: str) -> list[float]:
    """Train a split model for 3 steps, save it; return its logits of a probe batch."""
    torch.manual_seed(0)
    model = parallelize_gpt(TinyGPT(CFG))
    train_lm(model, token_batches(3, 4, CFG), vocab_parallel_cross_entropy)
    save_checkpoint(model, path)
    return _probe(model)


def _probe(model: torch.nn.Module) -> list[float]:
    """Sum of logits per vocabulary slice on this rank... made whole by a gather."""
    x, _ = token_batches(1, 2, CFG, seed=7)[0]
    with torch.no_grad():
        logits = model(x)  # (B, T, V / N)
    if dist.is_initialized() and logits.shape[-1] != CFG.vocab:
        pieces = [torch.empty_like(logits) for _ in range(dist.get_world_size())]
        dist.all_gather(pieces, logits.contiguous())
        logits = torch.cat(pieces, -1)
    return logits.flatten().tolist()


def _load(path: str) -> list[float]:
    torch.manual_seed(123)  # other weights: the checkpoint must replace them all
    model = parallelize_gpt(TinyGPT(CFG))
    load_checkpoint(model, path)
    return _probe(model)


def _bad(path: str) -> list[str]:
    torch.manual_seed(0)
    wider = parallelize_gpt(TinyGPT(GPTConfig(n_embd=48)))
    torch.manual_seed(dist.get_rank())  # a different model on each rank
    return [
        error_of(lambda: load_checkpoint(wider, path)),
        error_of(lambda: parallelize_gpt(TinyGPT(CFG))),
    ]


def test_checkpoint_saved_on_two_ranks_loads_on_four_and_on_one(tmp_path: Path) -> None:
    path = str(tmp_path / "tp.pt")
    saved = spawn(_save, 2, path, timeout=30)[0]
    on_four = spawn(_load, 4, path, timeout=30)
    one = TinyGPT(CFG)
    one.load_state_dict(torch.load(path, weights_only=True))  # the plain keys
    on_one = _probe(one)
    close = functools.partial(torch.testing.assert_close, atol=1e-5, rtol=0)
    close(torch.tensor(on_four[0]), torch.tensor(saved))
    close(torch.tensor(on_one), torch.tensor(saved))
    for errors in spawn(_bad, 2, path, timeout=5, deadline=30):  # every rank
        assert errors == [
            "checkpoint does not fit this model: 'tok.weight' has shape [64, 32] in "
            "the checkpoint, [64, 48] in the model",
            "parallelize_gpt: parameter 'tok.weight' differs across ranks; seed "
            "every rank alike before building the model",
        ]
