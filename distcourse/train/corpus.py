"""The book's own text as characters: the corpus chapter 13's trainer learns.

Why the book, read at run time: it is real prose (and code) that every checkout
already has, so nothing is downloaded when a run starts and nothing large is
shipped twice. The text is read from the repository the package sits in
(`book/` beside `distcourse/`): every `*.md` page and the markdown cells of every
`*.ipynb` chapter, in file-name order. An installed package without its book
reads another folder of pages (`Corpus.from_book(folder)`, the script's
`--book`) or any text (`Corpus.from_text`). Shipping a copy inside the package
was the other choice: it would go stale as the chapters change, and the
repository is where the trainer is run.

One frozen excerpt ships with the package (`Corpus.excerpt()`, `data/`): the
first 65,536 characters of the book as they stood in November 2026. Chapter 13's
stored outputs are made with it, so that they stay the same while the chapters
they were read from are edited; the script trains on it with `--excerpt`.

The book changes as it is written, so a corpus carries a `fingerprint` (the first
16 hex digits of the text's SHA-256): a checkpoint records it and a resume on other
text is refused, since the batches would differ.

Batches are a pure function of (seed, step, batch, seq): step `s` draws its
`batch` windows of `seq + 1` characters from a generator seeded by (seed, s). The
data position of a run is therefore just its step: a resumed run, on any layout,
reads exactly the batches an uninterrupted run would.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from distcourse.arguments import positive_int

BOOK = Path(__file__).resolve().parents[2] / "book"  # the repository's book
EXCERPT = Path(__file__).resolve().parent / "data" / "book_excerpt.txt"
PAD_TO = 8  # vocabulary padded to a multiple: tp = 1, 2, 4, 8 divide it


def read_book(book: Path = BOOK) -> str:
    """The text of `book`: each `*.md` file and each notebook's markdown cells,
    by file name, joined by blank lines. FileNotFoundError if there is none."""
    parts: list[str] = []
    for path in sorted([*book.glob("*.md"), *book.glob("*.ipynb")]):
        if path.suffix == ".md":
            parts.append(path.read_text(encoding="utf-8"))
            continue
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        parts += ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown"]
    if not parts:
        raise FileNotFoundError(f"no *.md or *.ipynb pages in {book}")
    return "\n\n".join(parts)


@dataclass(frozen=True)
class Corpus:
    """A text, its character vocabulary and the text as token ids.

    `chars` are the distinct characters in code-point order; the vocabulary is
    padded to a multiple of PAD_TO with ids no character maps to (they are never
    targets), so tensor parallelism can split the embedding and the head."""

    text: str
    chars: tuple[str, ...]
    ids: Tensor  # (len(text),) int64

    @classmethod
    def from_text(cls, text: str) -> Corpus:
        """A corpus of `text` (at least two characters)."""
        if len(text) < 2:
            raise ValueError(f"a corpus needs 2 characters or more, got {len(text)}")
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
        """Vocabulary size for the model: the characters, padded to PAD_TO."""
        return -(-len(self.chars) // PAD_TO) * PAD_TO

    @property
    def fingerprint(self) -> str:
        """16 hex digits of the text's SHA-256: which text a run trained on."""
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()[:16]

    def encode(self, text: str) -> Tensor:
        """Token ids of `text` (KeyError on a character outside the corpus)."""
        index = {c: i for i, c in enumerate(self.chars)}
        return torch.tensor([index[c] for c in text], dtype=torch.int64)

    def decode(self, ids: Tensor) -> str:
        """The characters of `ids`."""
        return "".join(self.chars[i] for i in ids.tolist())

    def batch(
        self, step: int, batch: int, seq: int, seed: int = 0
    ) -> tuple[Tensor, Tensor]:
        """Step `step`'s inputs and targets, each (batch, seq) int64 on the host:
        `batch` windows at offsets drawn from a generator seeded by (seed, step);
        the targets are the inputs shifted by one character."""
        positive_int(batch, "batch")
        positive_int(seq, "seq")
        if step < 0:
            raise ValueError(f"step={step} must be 0 or more")
        if seq + 1 > len(self.ids):
            raise ValueError(
                f"seq={seq} needs {seq + 1} characters; the corpus has {len(self.ids)}"
            )
        gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
        starts = torch.randint(0, len(self.ids) - seq, (batch, 1), generator=gen)
        window = self.ids[starts + torch.arange(seq + 1)]  # (batch, seq + 1)
        return window[:, :-1], window[:, 1:]

    def batches(
        self, start: int, steps: int, batch: int, seq: int, seed: int = 0
    ) -> list[tuple[Tensor, Tensor]]:
        """Steps start, start + 1, ... start + steps - 1 (`batch` for each)."""
        return [self.batch(s, batch, seq, seed) for s in range(start, start + steps)]
