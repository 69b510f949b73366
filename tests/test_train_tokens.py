"""The BPE corpus: the book and the installed Python as documents, a byte-level
BPE trained on them, two memory-mapped token files, cached by a hash of the
inputs (a cache folder of the test's own, small inputs: seconds)."""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from distcourse.train import corpus, flags, tokens

DOCS = [
    (f"doc{i}.py", f"def f{i}(x):\n    return x * {i} + sum(range({i}))\n" * 20)
    for i in range(40)
]


def test_a_corpus_is_built_once_and_read_back(tmp_path: Path) -> None:
    built = tokens.build(DOCS, 300, train_mb=1, held_out_pct=10, root=tmp_path)
    assert built.vocab == 300 and built.train.dtype == np.uint16
    assert isinstance(built.train, np.memmap) and isinstance(built.val, np.memmap)
    meta = built.meta
    held = sum(tokens.held_out(n, 10) for n, _ in DOCS)
    assert meta["val"]["documents"] == held and meta["train"]["documents"] == 40 - held
    assert meta["train"]["tokens"] == len(built.train) > 1000
    eot = built.tokenizer.token_to_id(tokens.EOT)
    assert int((built.train == eot).sum()) == 40 - held  # one after each document
    text = "def f3(x):\n    return x\n"
    assert built.decode(built.encode(text)) == text  # byte-level: nothing lost
    stamp = os.stat(built.path / "train.bin").st_mtime_ns
    again = tokens.build(DOCS, 300, train_mb=1, held_out_pct=10, root=tmp_path)
    assert again.path == built.path and again.fingerprint == built.fingerprint
    assert os.stat(again.path / "train.bin").st_mtime_ns == stamp  # not rebuilt
    other = tokens.build(DOCS, 280, train_mb=1, held_out_pct=10, root=tmp_path)
    assert other.path != built.path and other.vocab == 280
    assert not list(tmp_path.glob(".tmp-*"))


def test_a_tiny_corpus_still_holds_a_document_out(tmp_path: Path) -> None:
    two = DOCS[:2]
    built = tokens.build(two, 280, root=tmp_path, held_out_pct=0)
    assert built.meta["val"]["documents"] == 1 and built.meta["train"]["documents"] == 1


def test_documents_are_the_book_then_the_installed_python(tmp_path: Path) -> None:
    docs = tokens.documents(0.001)  # the book alone passes 1 kB
    assert docs[0][0].startswith("book/") and all(
        n.startswith("book/") for n, _ in docs
    )
    source = tmp_path / "a.py"
    source.write_text("x = 1\n")
    more = tokens.documents(100, files=[source])
    assert more[-1] == (str(source), "x = 1\n")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    first = next(tokens.installed_files())
    assert first.suffix == ".py" and stdlib in first.parents


def test_one_long_text_is_cut_into_documents() -> None:
    docs = tokens.pieces("excerpt", "abcdefghij", size=4)
    assert docs == [
        ("excerpt/0000", "abcd"),
        ("excerpt/0001", "efgh"),
        ("excerpt/0002", "ij"),
    ]


def test_the_cache_root_follows_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(corpus.CACHE_ENV, str(tmp_path))
    assert corpus.cache_root() == tmp_path
    path = flags.metrics_path(None)  # a run's metrics go there by default
    assert path.startswith(str(tmp_path / "runs")) and path.endswith("metrics.jsonl")
    assert (
        flags.metrics_path("none") is None
        and flags.metrics_path("m.jsonl") == "m.jsonl"
    )
    monkeypatch.delenv(corpus.CACHE_ENV)
    assert corpus.cache_root() == Path.home() / ".cache" / "distcourse"
