"""distcourse.viz.tensors: per-rank values, TP layouts and SBP pieces build headless."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from distcourse import viz  # noqa: E402


def test_rank_tensors_draws_one_labelled_cell_per_value() -> None:
    before = [torch.tensor([1.0, 2.0, 3.0]) * (r + 1) for r in range(3)]
    after = [torch.tensor([6.0, 12.0, 18.0])] * 3
    fig = viz.rank_tensors(before, after, "all_reduce(SUM)")
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    left, right = fig.axes
    assert [t.get_text() for t in right.texts[:3]] == ["6", "12", "18"]
    assert [t.get_text() for t in left.get_yticklabels()][0] == "rank 0"
    assert len(left.patches) == len(right.patches) == 9


def test_rank_tensors_handles_uneven_rows_and_non_integers() -> None:
    fig = viz.rank_tensors([torch.tensor([0.5]), torch.tensor([])], [torch.ones(4)] * 2)
    assert "0.5" in [t.get_text() for t in fig.axes[0].texts]


def test_tp_layout_colours_one_block_per_rank_where_a_tensor_is_split() -> None:
    fig = viz.tp_layout(4, title="4 ranks")
    assert isinstance(fig, Figure) and len(fig.axes) == 6
    blocks = [len(ax.patches) for ax in fig.axes]
    assert blocks == [1, 4, 4, 4, 4, 1]  # X whole; W, Y split; row: X, W split; sum
    labels = [t.get_text() for t in fig.axes[1].texts]
    assert labels == [f"rank\n{r}" for r in range(4)]
    assert fig.axes[0].get_ylabel() == "column-parallel"
    col_y, row_y = fig.axes[2].patches, fig.axes[4].patches
    assert col_y[1].get_x() == 2 and col_y[1].get_width() == 2  # columns of Y
    assert row_y[0].get_height() == 8 and row_y[3].get_x() == 6  # columns of W


def test_tp_layout_rejects_no_ranks() -> None:
    with pytest.raises(ValueError, match="positive number of ranks"):
        viz.tp_layout(0)


def test_sbp_pieces_draws_a_panel_per_rank_and_signature() -> None:
    whole = torch.arange(16.0).reshape(4, 4)
    pieces = {
        "S(0)": list(whole.tensor_split(4)),
        "P": [whole] + [whole * 0] * 3,
        "S(1) of 6": [torch.ones(2, 1), torch.ones(2, 0)] * 2,
    }
    fig = viz.sbp_pieces(pieces, "one tensor")
    assert len(fig.axes) == 12 and fig.axes[0].get_ylabel() == "S(0)"
    assert [t.get_text() for t in fig.axes[1].texts] == ["4", "5", "6", "7"]
    assert fig.axes[4].get_title() == "rank 0: (4, 4)" and len(fig.axes[4].texts) == 16
    assert len(fig.axes[9].images) == 0  # an empty piece draws nothing


def test_sbp_pieces_rejects_no_ranks() -> None:
    with pytest.raises(ValueError, match="one rank"):
        viz.sbp_pieces({"B": []})
