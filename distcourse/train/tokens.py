"""A real corpus every machine already holds: the book, and the Python it runs on.

Documents, in this order: the book's pages (`corpus.read_pages`), then the
Python source and documentation installed on this machine: the standard
library's `*.py` files and the environment's packages' `*.py`, `*.md`, `*.rst`
and `*.txt` files (`sysconfig`'s stdlib and purelib folders), each folder in path
order, until `limit_mb` megabytes are read. Hundreds of MB are there on any
machine with torch installed, so `--corpus-mb` sets the size, not the download.

A byte-level BPE (Hugging Face `tokenizers`, GPT-2's scheme: any byte sequence
encodes, nothing is unknown) is trained on the first `train_mb` of them with
`vocab` tokens, then every document is encoded, an end-of-text token after each,
into two flat token files: `val.bin`, the documents whose path hashes into the
held-out share (crc32 % 100 < `held_out_pct`), and `train.bin`, the rest. They
are read as `numpy.memmap`s: a rank touches only the windows it samples.

Everything lands in a folder named by a hash of its inputs (the documents'
bytes, the vocabulary, the held-out share and the tokenizers version) under
`cache_root()`: $DISTCOURSE_CACHE, or ~/.cache/distcourse. A second run with the
same inputs reads it at once; another machine's Python makes another corpus. The
folder is built once per machine: the first process to take its lock builds it
(into a temporary folder, renamed when complete), the others wait and read it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import sysconfig
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tokenizers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from distcourse.train.corpus import BOOK, cache_root, read_pages

EOT = "<|endoftext|>"
SOURCE_SUFFIXES = (".py",)
DOC_SUFFIXES = (".md", ".rst", ".txt")
LARGEST_FILE = 2**20  # bytes: larger files are data, not prose or code


def installed_files() -> Iterator[Path]:
    """The standard library's sources, then the environment's packages' sources
    and documentation, each folder in path order."""
    paths = sysconfig.get_paths()
    stdlib, purelib = Path(paths["stdlib"]), Path(paths["purelib"])
    for root, suffixes in (
        (stdlib, SOURCE_SUFFIXES),
        (purelib, SOURCE_SUFFIXES + DOC_SUFFIXES),
    ):
        for path in sorted(root.rglob("*")):
            if (
                path.suffix not in suffixes
                or "site-packages" in path.relative_to(root).parts
            ):
                continue
            try:
                if path.is_file() and path.stat().st_size <= LARGEST_FILE:
                    yield path
            except OSError:
                continue


def documents(
    limit_mb: float, book: Path = BOOK, files: Iterable[Path] | None = None
) -> list[tuple[str, str]]:
    """(name, text) of the book's pages, then of `files` (default: the installed
    ones), until `limit_mb` megabytes of text are read."""
    docs = [(f"book/{name}", text) for name, text in read_pages(book)]
    total, limit = sum(len(t) for _, t in docs), int(limit_mb * 2**20)
    for path in installed_files() if files is None else files:
        if total >= limit:
            break
        text = path.read_text(encoding="utf-8", errors="replace")
        docs.append((str(path), text))
        total += len(text)
    return docs


def pieces(name: str, text: str, size: int = 4096) -> list[tuple[str, str]]:
    """`text` cut into documents of `size` characters, named `name/0000`, ...: a
    corpus of one long text (chapter 13's frozen excerpt) with a held-out share."""
    return [
        (f"{name}/{i // size:04d}", text[i : i + size])
        for i in range(0, len(text), size)
    ]


def held_out(name: str, pct: int) -> bool:
    """Whether document `name` belongs to the held-out split."""
    return zlib.crc32(name.encode()) % 100 < pct


def key(docs: list[tuple[str, str]], vocab: int, train_mb: float, pct: int) -> str:
    """16 hex digits naming a corpus: its inputs' hash."""
    h = hashlib.sha256(f"{tokenizers.__version__} {vocab} {train_mb} {pct}".encode())
    for name, text in docs:
        h.update(name.encode() + b"\0" + text.encode("utf-8", "replace") + b"\0")
    return h.hexdigest()[:16]


def train_tokenizer(texts: list[str], vocab: int) -> Tokenizer:
    """A byte-level BPE of `vocab` tokens (the end-of-text token included)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return tok


@dataclass(frozen=True)
class TokenCorpus:
    """A tokenizer and the corpus as two memory-mapped token files."""

    path: Path
    tokenizer: Tokenizer
    train: np.ndarray  # memmap of token ids
    val: np.ndarray
    fingerprint: str
    meta: dict

    @property
    def vocab(self) -> int:
        """The tokenizer's vocabulary size (the model pads it)."""
        return self.tokenizer.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text).ids

    def decode(self, ids: Iterable[int]) -> str:
        return self.tokenizer.decode(list(ids))

    @classmethod
    def load(cls, path: Path) -> TokenCorpus:
        """A built corpus folder."""
        meta = json.loads((path / "meta.json").read_text(encoding="utf-8"))
        dtype = np.dtype(meta["dtype"])
        files = [
            np.memmap(path / f"{s}.bin", dtype=dtype, mode="r")
            for s in ("train", "val")
        ]
        tok = Tokenizer.from_file(str(path / "tokenizer.json"))
        return cls(path, tok, files[0], files[1], meta["key"], meta)


def build(
    docs: list[tuple[str, str]],
    vocab: int = 32000,
    *,
    train_mb: float = 16.0,
    held_out_pct: int = 5,
    root: Path | None = None,
) -> TokenCorpus:
    """The corpus of `docs`, from the cache when its inputs were built before."""
    name = key(docs, vocab, train_mb, held_out_pct)
    root = cache_root() if root is None else Path(root)
    final = root / f"corpus-{name}"
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".corpus-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder per machine, the rest wait
        if not (final / "meta.json").is_file():
            _write(final, docs, vocab, train_mb, held_out_pct, name)
    return TokenCorpus.load(final)


def _write(
    final: Path,
    docs: list[tuple[str, str]],
    vocab: int,
    train_mb: float,
    pct: int,
    name: str,
) -> None:
    tmp = final.with_name(f".tmp-{final.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    sample, size = [], 0
    for _, text in docs:
        if size >= train_mb * 2**20:
            break
        sample.append(text)
        size += len(text)
    tok = train_tokenizer(sample, vocab)
    tok.save(str(tmp / "tokenizer.json"))
    eot = tok.token_to_id(EOT)
    dtype = np.uint16 if tok.get_vocab_size() <= 2**16 else np.uint32
    val = {n for n, _ in docs if held_out(n, pct)}
    if not val or len(val) == len(docs):  # a tiny corpus: its last document
        val = {docs[-1][0]}
    counts = {}
    for split, wanted in (("train", False), ("val", True)):
        chosen = [t for n, t in docs if (n in val) == wanted]
        ids = [
            np.asarray(e.ids + [eot], dtype=dtype)
            for e in tok.encode_batch_fast(chosen)
        ]
        flat = np.concatenate(ids)
        flat.tofile(tmp / f"{split}.bin")
        counts[split] = dict(documents=len(chosen), tokens=int(flat.size))
    meta = dict(
        key=name,
        vocab=tok.get_vocab_size(),
        dtype=np.dtype(dtype).name,
        bytes=sum(len(t) for _, t in docs),
        documents=len(docs),
        train_mb=train_mb,
        held_out_pct=pct,
        tokenizers=tokenizers.__version__,
        **counts,
    )
    (tmp / "meta.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
    shutil.rmtree(final, ignore_errors=True)
    os.rename(tmp, final)
