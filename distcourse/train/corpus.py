"""The book's own text as characters: chapter 13's quick corpus.

Why the book, read at run time: it is real prose (and code) that every checkout
already has, so nothing is downloaded when a run starts and nothing large is
shipped twice. The text is read from the repository the package sits in
(`book/` beside `distcourse/`): every `*.md` page and the markdown cells of every
`*.ipynb` chapter, in file-name order (`read_pages`). An installed package without
its book reads another folder of pages (`Corpus.from_book(folder)`, the script's
`--book`) or any text (`Corpus.from_text`). The larger corpus, the book and the
machine's installed Python under a byte-level BPE, is `tokens.py`'s.

One frozen excerpt ships with the package (`Corpus.excerpt()`, `data/`): the
first 65,536 characters of the book as they stood in November 2026. Chapter 13's
stored outputs are made with it, so that they stay the same while the chapters
they were read from are edited; the script trains on it with `--excerpt`.

A corpus carries a `fingerprint` (the first 16 hex digits of the text's SHA-256):
a checkpoint records it and a resume on other text is refused. Its last tenth is
held out (`val`) for the eval loss; `train` is the rest. Batches are drawn by
`sampler.Sampler`, from either kind of corpus alike.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

BOOK = Path(__file__).resolve().parents[2] / "book"  # the repository's book
EXCERPT = Path(__file__).resolve().parent / "data" / "book_excerpt.txt"
HELD_OUT = 10  # the last 1/HELD_OUT of a character corpus is held out
CACHE_ENV = "DISTCOURSE_CACHE"


def cache_root() -> Path:
    """Where the trainer keeps what it builds (BPE corpora, a run's metrics unless
    told where): $DISTCOURSE_CACHE, else ~/.cache/distcourse."""
    found = os.environ.get(CACHE_ENV)
    return Path(found) if found else Path.home() / ".cache" / "distcourse"


def read_pages(book: Path = BOOK) -> list[tuple[str, str]]:
    """(file name, text) of each page of `book`: each `*.md` file and each
    notebook's markdown cells (joined by blank lines), by file name.
    FileNotFoundError if there is none."""
    pages = []
    for path in sorted([*book.glob("*.md"), *book.glob("*.ipynb")]):
        if path.suffix == ".md":
            pages.append((path.name, path.read_text(encoding="utf-8")))
            continue
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        parts = ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown"]
        pages.append((path.name, "\n\n".join(parts)))
    if not pages:
        raise FileNotFoundError(f"no *.md or *.ipynb pages in {book}")
    return pages


def read_book(book: Path = BOOK) -> str:
    """The text of `book`'s pages joined by blank lines (`read_pages`)."""
    return "\n\n".join(text for _, text in read_pages(book))


@dataclass(frozen=True)
class Corpus:
    """A text, its character vocabulary and the text as token ids.

    `chars` are the distinct characters in code-point order; `ids` the whole
    text's, `train` its first nine tenths and `val` the last tenth."""

    text: str
    chars: tuple[str, ...]
    ids: Tensor  # (len(text),) int64

    @classmethod
    def from_text(cls, text: str) -> Corpus:
        """A corpus of `text` (at least 20 characters: both splits hold 2)."""
        if len(text) < 2 * HELD_OUT:
            raise ValueError(
                f"a corpus needs {2 * HELD_OUT} characters or more, got {len(text)}"
            )
        chars = tuple(sorted(set(text)))
        index = {c: i for i, c in enumerate(chars)}
        ids = torch.tensor([index[c] for c in text], dtype=torch.int64)
        return cls(text, chars, ids)

    @classmethod
    def from_book(cls, book: Path = BOOK) -> Corpus:
        """The corpus of the book's pages (`read_book`)."""
        return cls.from_text(read_book(book))

    @classmethod
    def excerpt(cls) -> Corpus:
        """The frozen excerpt shipped with the package (the book's first 65,536
        characters, November 2026): fixed text for fixed outputs."""
        return cls.from_text(EXCERPT.read_text(encoding="utf-8"))

    @property
    def vocab(self) -> int:
        """Distinct characters (the model pads its vocabulary)."""
        return len(self.chars)

    @property
    def split(self) -> int:
        """Where the held-out tenth begins."""
        return len(self.ids) - len(self.ids) // HELD_OUT

    @property
    def train(self) -> Tensor:
        """The ids batches are drawn from."""
        return self.ids[: self.split]

    @property
    def val(self) -> Tensor:
        """The held-out ids, for the eval loss."""
        return self.ids[self.split :]

    @property
    def fingerprint(self) -> str:
        """16 hex digits of the text's SHA-256: which text a run trained on."""
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()[:16]

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (KeyError on a character outside the corpus)."""
        index = {c: i for i, c in enumerate(self.chars)}
        return [index[c] for c in text]

    def decode(self, ids: object) -> str:
        """The characters of `ids` (a tensor or a list of ints)."""
        values = ids.tolist() if isinstance(ids, Tensor) else list(ids)  # type: ignore[attr-defined]
        return "".join(self.chars[i] for i in values)
