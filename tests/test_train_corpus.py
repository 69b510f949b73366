"""The trainer's corpus: the book's text, its vocabulary, batches by step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from distcourse.train.corpus import PAD_TO, Corpus, read_book


def test_the_book_is_read_from_its_pages_and_notebook_markdown() -> None:
    text = read_book()
    corpus = Corpus.from_text(text)
    assert len(text) > 100_000  # the chapters, not a toy
    assert corpus.vocab % PAD_TO == 0 and corpus.vocab >= len(corpus.chars)
    assert corpus.decode(corpus.ids[:200]) == text[:200]


def test_markdown_cells_only_in_file_name_order(tmp_path: Path) -> None:
    nb = {
        "cells": [
            {"cell_type": "markdown", "source": ["# One\n", "words"]},
            {"cell_type": "code", "source": ["print('no')"]},
        ]
    }
    (tmp_path / "b.ipynb").write_text(json.dumps(nb))
    (tmp_path / "a.md").write_text("first")
    assert read_book(tmp_path) == "first\n\n# One\nwords"
    with pytest.raises(FileNotFoundError, match="no \\*.md"):
        read_book(tmp_path / "missing")


def test_batches_depend_on_the_step_only() -> None:
    corpus = Corpus.from_text("the quick brown fox jumps over the lazy dog " * 20)
    x, y = corpus.batch(3, 4, 16, seed=1)
    assert x.shape == y.shape == (4, 16) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets: the next character
    again = corpus.batches(2, 3, 4, 16, seed=1)[1]
    assert torch.equal(again[0], x) and torch.equal(again[1], y)
    assert not torch.equal(corpus.batch(4, 4, 16, seed=1)[0], x)
    assert not torch.equal(corpus.batch(3, 4, 16, seed=2)[0], x)


def test_fingerprint_and_bad_arguments() -> None:
    a, b = Corpus.from_text("abcabc"), Corpus.from_text("abcabd")
    assert a.fingerprint != b.fingerprint and len(a.fingerprint) == 16
    assert a.decode(a.encode("cab")) == "cab"
    with pytest.raises(ValueError, match="seq=9 needs 10 characters"):
        a.batch(0, 1, 9)
    with pytest.raises(ValueError, match="step=-1"):
        a.batch(-1, 1, 2)
    with pytest.raises(ValueError, match="2 characters"):
        Corpus.from_text("a")
