"""The one table formatter: f-string widths, a last cell without trailing padding."""

import pytest

from distcourse import tables


def test_columns_take_their_width_alignment_and_gap() -> None:
    text = tables.aligned(
        [("name", "n", "mid"), ("a", 12, "x")],
        widths=(6, 4, 5),
        align="<>^",
        gaps=(1, 2),
    )
    assert text.splitlines() == ["name      n   mid", "a        12    x"]


def test_a_wide_cell_pushes_its_line_as_an_f_string_does() -> None:
    rows = [("ab", 1), ("abcdef", 2)]
    assert tables.aligned(rows, widths=(3, 2), align="<>") == "ab   1\nabcdef  2"


def test_no_line_ends_in_padding_of_its_last_cell() -> None:
    rows = [("a", "b"), ("longer", "c", "")]
    text = tables.aligned(rows, widths=(8, 3, 4), align="<^<", gaps=0)
    # the short row's last cell is centred but not padded on its right; the longer
    # row's second cell keeps its padding because another cell follows it
    assert text.splitlines() == ["a        b", "longer   c "]


def test_without_widths_each_column_is_as_wide_as_its_widest_cell() -> None:
    rows = [("  nbval", "installed 1"), ("  a-longer-name", "not installed")]
    assert tables.aligned(rows, gaps=2).splitlines() == [
        "  nbval          installed 1",
        "  a-longer-name  not installed",
    ]


def test_a_total_spans_columns_with_empty_cells() -> None:
    rows = [("op", "kind", "bytes"), ("total", "", "1,024")]
    text = tables.aligned(rows, widths=(4, 6, 7), align="<<>", gaps=0)
    assert text.splitlines() == ["op  kind    bytes", "total        1,024"]


def test_bad_layouts_are_named() -> None:
    with pytest.raises(ValueError, match="align takes only '<>\\^', not '\\|'"):
        tables.aligned([("a",)], align="|")
    with pytest.raises(ValueError, match="1 widths for rows of up to 2 cells"):
        tables.aligned([("a", "b")], widths=(3,))
    with pytest.raises(ValueError, match="1 gaps for rows of up to 3 cells"):
        tables.aligned([("a", "b", "c")], gaps=(1,))
    assert tables.aligned([]) == ""


# --------------------------------------------------------------------- Table ----


def test_a_table_prints_as_aligned_text_and_displays_as_html() -> None:
    table = tables.Table(
        ("layout", "step ms"), [("8x1x1", "1.50"), ("2x2x2", "12.25")], align="<>"
    )
    assert str(table) == tables.aligned(
        [("layout", "step ms"), ("8x1x1", "1.50"), ("2x2x2", "12.25")],
        align="<>",
        gaps=2,
    )
    bundle = table._repr_mimebundle_()
    assert bundle["text/plain"] == str(table)
    html = bundle["text/html"]
    assert html.startswith('<div class="dc-table"><table')
    assert html.count("<th ") == 2 and html.count("<td ") == 4
    # numbers right-aligned as in the text; every cell labelled with its column
    assert 'data-label="step ms" style="' in html
    assert 'text-align:right">12.25</td>' in html
    assert "white-space:pre" in html  # a cell never wraps


def test_a_table_escapes_its_cells_and_shows_its_caption_in_both_forms() -> None:
    table = tables.Table(("op",), [("<all_reduce>",)], caption="one & two")
    assert str(table).splitlines() == ["one & two", "op", "<all_reduce>"]
    html = table.html()
    assert "&lt;all_reduce&gt;" in html and "<all_reduce>" not in html
    assert ">one &amp; two</caption>" in html


def test_a_short_row_spans_the_columns_left() -> None:
    table = tables.Table(("a", "b", "c"), [("1", "2", "3"), ("total 6",)])
    assert '<td colspan="3" data-label="a"' in table.html()
    assert str(table).splitlines()[-1] == "total 6"
