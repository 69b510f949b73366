"""Chapter 13: the book's trainer, composing chapters 3-10's strategies.

    corpus = Corpus.from_book()                  # the book's text as characters
    layout = TrainLayout(dp=2, pp=2, tp=2, micro_batches=2, dtype="bfloat16")
    check(layout, RunConfig().model(corpus), world=8)   # before any rank starts
    trainer = Trainer(layout, RunConfig(ckpt_dir="ckpt", ckpt_every=5), corpus)
    losses = trainer.fit()                        # on every rank (a collective)

Modules: corpus (the book as characters), tokens (the book and the installed
Python under a byte-level BPE, memory-mapped), sampler (each rank's rows of a
step's batch; resumes exactly), model (presets, GPT-2's initialisation by name,
FLOPs), layout (the flags, checked and refused by name), state (the composed
model on this rank), checkpoint (sharded DCP, atomic, any layout), metrics
(tokens/s, MFU, measured and planned memory; JSON lines and TensorBoard),
trainer (Trainer, RunConfig), compare (against one process), progress (the bar
and the loss curve), fault (the kill drill), flags and cli (the script).
`book/scripts/train_gpt.py` is its script.
"""

from distcourse.train.checkpoint import Snapshot, latest, load, save
from distcourse.train.compare import TOL, against_one_process, one_process, verdicts
from distcourse.train.corpus import Corpus, read_book, read_pages
from distcourse.train.layout import TrainLayout, accepted, check, refuse_pairs
from distcourse.train.progress import Progress, save_curve
from distcourse.train.sampler import Sampler
from distcourse.train.trainer import RunConfig, Trainer

__all__ = [
    "TOL",
    "Corpus",
    "Progress",
    "RunConfig",
    "Sampler",
    "Snapshot",
    "TrainLayout",
    "Trainer",
    "accepted",
    "against_one_process",
    "check",
    "latest",
    "load",
    "one_process",
    "read_book",
    "read_pages",
    "refuse_pairs",
    "save",
    "save_curve",
    "verdicts",
]
