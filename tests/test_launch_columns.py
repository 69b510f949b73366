"""Per-rank output laid out side by side: folding and both forms, without engines."""

from __future__ import annotations

import re

import pytest

from distcourse.launch.columns import (
    PerRank,
    RankOutput,
    Shared,
    fold,
    show,
    split_lines,
    to_html,
    to_text,
)


def test_lines_every_rank_printed_identically_fold_into_one_shared_row() -> None:
    outputs = [
        [f"rank {r}: loss {r}.5", "parameters identical: True"] for r in range(4)
    ]
    rows = fold(outputs)
    assert rows == [
        PerRank(tuple((f"rank {r}: loss {r}.5",) for r in range(4))),
        Shared(("parameters identical: True",)),
    ]
    assert to_text(rows).splitlines() == [
        "[rank 0] rank 0: loss 0.5",
        "[rank 1] rank 1: loss 1.5",
        "[rank 2] rank 2: loss 2.5",
        "[rank 3] rank 3: loss 3.5",
        "[all ranks] parameters identical: True",
    ]


def test_shared_lines_between_differing_ones_keep_their_order() -> None:
    outputs = [["start", f"r{r}", "middle", "end"] for r in range(2)]
    outputs[1].insert(1, "extra")
    rows = fold(outputs)
    assert rows == [
        Shared(("start",)),
        PerRank((("r0",), ("extra", "r1"))),
        Shared(("middle", "end")),
    ]


def test_a_rank_that_prints_nothing_folds_nothing_and_keeps_its_column() -> None:
    outputs = [["same"], ["same"], [], ["same"]]
    rows = fold(outputs)
    assert rows == [PerRank((("same",), ("same",), (), ("same",)))]
    assert to_text(rows).splitlines() == [
        "[rank 0] same",
        "[rank 1] same",
        "[rank 3] same",
    ]
    page = to_html(rows, 4)
    assert page.count("<th ") == 4 and "rank 2</th>" in page
    assert page.count("<td") == 4  # rank 2's column is there, empty


def test_one_rank_shows_its_column_and_no_rank_shows_nothing() -> None:
    assert fold([["a", "b"]]) == [PerRank((("a", "b"),))]
    assert not RankOutput([[], [], []])
    assert not RankOutput([])


def test_html_has_a_column_per_rank_and_shared_rows_span_them() -> None:
    rows = fold([["same", f"mine {r}"] for r in range(8)])
    page = to_html(rows, 8)
    headers = re.findall(r"<th [^>]*>(.*?)</th>", page)
    assert headers == [f"rank {r}" for r in range(8)]
    assert page.count('colspan="8"') == 1
    assert page.count("mine ") == 8


def test_long_lines_wrap_inside_their_column() -> None:
    long = "x" * 500 + " " + "word " * 100
    page = to_html(fold([[long], ["short"]]), 2)
    assert "table-layout:fixed" in page and "width:100%" in page
    assert "white-space:pre-wrap" in page and "overflow-wrap:anywhere" in page
    assert "nowrap" not in page and "white-space:pre;" not in page


def test_html_escapes_what_ranks_print() -> None:
    page = to_html(fold([["<b>x</b> & y"]]), 1)
    assert "&lt;b&gt;x&lt;/b&gt; &amp; y" in page and "<b>x" not in page


def test_failed_ranks_are_named_in_both_forms() -> None:
    output = RankOutput([["a"], ["a"], [], ["a"]], {2: "ZeroDivisionError: boom"})
    bundle = output._repr_mimebundle_()
    assert bundle["text/plain"].splitlines()[-1] == (
        "[rank 2] raised ZeroDivisionError: boom"
    )
    assert "raised ZeroDivisionError: boom" in bundle["text/html"]


def test_a_progress_bar_redrawn_in_place_keeps_its_last_state() -> None:
    assert split_lines("epoch 1/5\repoch 5/5\ndone\n") == ["epoch 5/5", "done"]
    assert split_lines("") == []


def test_when_one_rank_alone_prints_only_its_column_is_drawn() -> None:
    page = to_html(fold([["SUM 10", "MAX 4"], [], [], []]), 4)
    assert re.findall(r"<th [^>]*>(.*?)</th>", page) == [
        "rank 0 (the only rank that printed)"
    ]
    assert page.count("<td ") == 1 and "SUM 10\nMAX 4" in page
    assert to_text(fold([[], ["got it"]])) == "[rank 1] got it"


def test_show_lays_out_texts_or_line_lists_of_each_rank(
    capsys: pytest.CaptureFixture[str],
) -> None:
    show(["loss 1.5\nsame\n", ["loss 1.2", "same"]])  # outside IPython: text/plain
    assert capsys.readouterr().out.splitlines() == [
        "[rank 0] loss 1.5",
        "[rank 1] loss 1.2",
        "[all ranks] same",
    ]
    show([["a\nb", 3], ["a", "b", "3"], []])  # a line with newlines is several
    assert capsys.readouterr().out.splitlines() == [
        "[rank 0] a",
        "[rank 0] b",
        "[rank 0] 3",
        "[rank 1] a",
        "[rank 1] b",
        "[rank 1] 3",
    ]


def test_show_refuses_what_is_not_one_output_per_rank() -> None:
    for bad in ([], "rank 0 only, as one string"):
        with pytest.raises(ValueError, match="one text or list of lines per rank"):
            show(bad)  # type: ignore[arg-type]
