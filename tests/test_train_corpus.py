"""The character corpus: the book's pages, its vocabulary, its held-out tenth."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from distcourse.train.corpus import Corpus, read_book, read_pages


def test_the_book_is_read_from_its_pages_and_notebook_markdown() -> None:
    text = read_book()
    corpus = Corpus.from_text(text)
    assert len(text) > 100_000  # the chapters, not a toy
    assert corpus.vocab == len(corpus.chars)
    assert corpus.decode(corpus.ids[:200]) == text[:200]
    names = [name for name, _ in read_pages()]
    assert names == sorted(names) and "13_trainer.ipynb" in names


def test_markdown_cells_only_in_file_name_order(tmp_path: Path) -> None:
    nb = {
        "cells": [
            {"cell_type": "markdown", "source": ["# One\n", "words"]},
            {"cell_type": "code", "source": ["print('no')"]},
        ]
    }
    (tmp_path / "b.ipynb").write_text(json.dumps(nb))
    (tmp_path / "a.md").write_text("first")
    assert read_pages(tmp_path) == [("a.md", "first"), ("b.ipynb", "# One\nwords")]
    assert read_book(tmp_path) == "first\n\n# One\nwords"
    with pytest.raises(FileNotFoundError, match="no \\*.md"):
        read_book(tmp_path / "missing")


def test_the_last_tenth_is_held_out() -> None:
    corpus = Corpus.from_text("abcdefghij" * 10)
    assert len(corpus.train) == 90 and len(corpus.val) == 10
    assert torch.equal(torch.cat([corpus.train, corpus.val]), corpus.ids)


def test_fingerprint_and_bad_arguments() -> None:
    a, b = Corpus.from_text("abc" * 10), Corpus.from_text("abd" * 10)
    assert a.fingerprint != b.fingerprint and len(a.fingerprint) == 16
    assert a.decode(a.encode("cab")) == "cab"
    with pytest.raises(ValueError, match="20 characters or more"):
        Corpus.from_text("a" * 19)
