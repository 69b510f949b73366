"""Each rank's rows of a step's batch: together the one-process batch, read from a
tensor or a memory map alike, resumed exactly from the sampler's state."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from distcourse.train.sampler import Sampler, held_out

TOKENS = torch.arange(1000) % 97


def test_dp_ranks_read_the_rows_of_one_process_batch() -> None:
    whole = Sampler(TOKENS, 8, 16, seed=3).at(5)
    parts = [Sampler(TOKENS, 8, 16, seed=3, dp=4, rank=r).at(5) for r in range(4)]
    assert torch.equal(torch.cat([x for x, _ in parts]), whole[0])
    assert torch.equal(torch.cat([y for _, y in parts]), whole[1])
    x, y = whole
    assert x.shape == (8, 16) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets: the next token


def test_a_memory_map_gives_the_same_windows(tmp_path) -> None:  # noqa: ANN001
    path = tmp_path / "tokens.bin"
    TOKENS.numpy().astype(np.uint16).tofile(path)
    mapped = np.memmap(path, dtype=np.uint16, mode="r")
    a, b = Sampler(TOKENS, 4, 8, seed=1).at(2), Sampler(mapped, 4, 8, seed=1).at(2)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_a_resumed_sampler_reads_what_an_uninterrupted_one_does() -> None:
    straight = Sampler(TOKENS, 4, 8, seed=1)
    want = [next(straight) for _ in range(5)]
    first = Sampler(TOKENS, 4, 8, seed=1)
    for _ in range(3):
        next(first)
    state = first.state_dict()
    again = Sampler(TOKENS, 4, 8, seed=1)
    again.load_state_dict(state)
    for x, y in want[3:]:
        got = next(again)
        assert torch.equal(got[0], x) and torch.equal(got[1], y)
    assert state == dict(step=3, seed=1, batch=4, seq=8)
    with pytest.raises(ValueError, match="sampler state has seed=1, this run's is 2"):
        Sampler(TOKENS, 4, 8, seed=2).load_state_dict(state)


def test_held_out_batches_are_fixed_and_bad_arguments_refused() -> None:
    a, b = held_out(TOKENS, 2, 4, 8), held_out(TOKENS, 2, 4, 8)
    assert all(torch.equal(p[0], q[0]) for p, q in zip(a, b, strict=True))
    assert not torch.equal(a[0][0], a[1][0])
    with pytest.raises(ValueError, match="seq=1000 needs 1001 tokens"):
        Sampler(TOKENS, 1, 1000).at(0)
    with pytest.raises(ValueError, match="batch of 6 does not split into dp=4"):
        Sampler(TOKENS, 6, 8, dp=4)
    with pytest.raises(ValueError, match="step=-1"):
        Sampler(TOKENS, 4, 8).at(-1)
