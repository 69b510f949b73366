"""Chapter 13: the book's trainer, composing chapters 3-10's strategies.

    corpus = Corpus.from_book()                  # the book's text as characters
    layout = TrainLayout(dp=2, pp=2, tp=2, micro_batches=2)
    check(layout, RunConfig().model(corpus), world=8)   # before any rank starts
    trainer = Trainer(layout, RunConfig(ckpt_dir="ckpt", ckpt_every=5), corpus)
    losses = trainer.fit()                        # on every rank (a collective)

Modules: corpus (text, vocabulary, batches by step), layout (the flags, checked
and refused by name), state (the composed model; one-process form), checkpoint
(DCP, atomic), trainer (Trainer, RunConfig), compare (against one process),
progress (the bar and the loss curve). `book/scripts/train_gpt.py` is its script.
"""

from distcourse.train.checkpoint import Snapshot, latest, read, save
from distcourse.train.compare import TOL, against_one_process, one_process, verdicts
from distcourse.train.corpus import Corpus, read_book
from distcourse.train.layout import TrainLayout, accepted, check, refuse_pairs
from distcourse.train.progress import Progress, save_curve
from distcourse.train.trainer import RunConfig, Trainer

__all__ = [
    "TOL",
    "Corpus",
    "Progress",
    "RunConfig",
    "Snapshot",
    "TrainLayout",
    "Trainer",
    "accepted",
    "against_one_process",
    "check",
    "latest",
    "one_process",
    "read",
    "read_book",
    "refuse_pairs",
    "save",
    "save_curve",
    "verdicts",
]
