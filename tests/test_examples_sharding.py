"""examples.sharding: chapter 9's model, rows and one-process run, in one process."""

from __future__ import annotations

import pytest
import torch

from distcourse.examples import sharding as ex


def test_the_model_is_uneven_and_seeded() -> None:
    model = ex.uneven_mlp()
    shapes = [(10, 6), (10,), (7, 10), (7,), (3, 7), (3,)]
    assert [tuple(p.shape) for p in model.parameters()] == shapes
    assert sum(p.numel() for p in model.parameters()) == 171
    assert torch.equal(model[0].weight, ex.uneven_mlp()[0].weight)


def test_each_rank_and_step_has_its_own_rows() -> None:
    x0, y0 = ex.batch(0, 0)
    assert x0.shape == (ex.ROWS, 6) and y0.shape == (ex.ROWS, 3)
    assert torch.equal(x0, ex.batch(0, 0)[0])
    assert not torch.equal(x0, ex.batch(0, 1)[0])
    assert not torch.equal(x0, ex.batch(1, 0)[0])


@pytest.mark.parametrize("kind", sorted(ex.OPTIMIZERS))
def test_one_process_of_one_rank_is_plain_training(kind: str) -> None:
    model = ex.uneven_mlp()
    losses = ex.train(model, ex.optimizer(kind, model.parameters()), rank=0)
    assert len(losses) == 3
    assert ex.max_difference(model.state_dict(), ex.one_process(1, kind)) == 0


def test_max_difference_refuses_other_keys() -> None:
    with pytest.raises(ValueError, match="different keys"):
        ex.max_difference({"a": torch.zeros(1)}, {"b": torch.zeros(1)})
