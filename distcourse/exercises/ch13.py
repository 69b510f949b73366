"""Chapter 13's exercises: the trainer, its checkpoints and its layouts.

1. `check_latest(fn)`: `fn(folder)` -> the newest complete checkpoint in `folder` (a
   `pathlib.Path`): the `step_<N>` folder with the largest N that holds its
   `meta.json`; None if there is none.
2. `check_redone_steps(x)`: a run checkpoints every 8 steps and a rank dies during
   step 21. How many steps, the interrupted one included, does the restarted group
   compute again before it passes the point where the rank died?
3. `check_checkpoint_bytes(x)`: bytes of the model and AdamW's two moments, in
   one-process form, for a model of 10 million float32 parameters (RNG and meta.json
   left out).
4. `check_accepted_16(x)`: the number of dp x pp x tp layouts of 16 ranks the trainer
   accepts for a TinyGPT of 4 blocks, 4 heads and vocabulary 64, with batches of 8
   sequences and 2 micro-batches where there is a pipeline.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from distcourse.examples.gpt import GPTConfig
from distcourse.exercises.core import Problem, call, check_answer, check_number
from distcourse.train.layout import accepted

EXERCISES = ("latest", "redone_steps", "checkpoint_bytes", "accepted_16")
FOLDERS = {  # name -> holds meta.json; the newest complete one is step_16
    "step_8": True,
    "step_16": True,
    "step_9": True,  # by number, not by name: "step_9" > "step_16" as text
    "step_24": False,  # being written by hand, or half copied
    ".tmp_step_32": True,  # a crashed save's leftovers
    "notes": False,
}


def latest_judge(answer: object) -> Problem:
    """The answer on a folder of checkpoints, and on an empty one."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if call(answer, root) is not None:
            return "an empty folder has no checkpoint: expected None"
        for name, complete in FOLDERS.items():
            (root / name).mkdir()
            if complete:
                (root / name / "meta.json").write_text("{}")
        got = call(answer, root)
        want = root / "step_16"
        if not isinstance(got, Path) or got.resolve() != want.resolve():
            shown = got.name if isinstance(got, Path) else repr(got)
            return f"of {', '.join(FOLDERS)}: expected step_16, got {shown}"
    return None


def check_latest(answer: object) -> bool:
    """`answer(folder) -> Path | None`, checked in this process."""
    return check_answer(
        "ch13.latest",
        answer,
        latest_judge,
        hint="keep folders named step_<digits> that hold meta.json; the largest "
        "int of the digits, not the largest name (step_9 sorts after step_16)",
    )


def check_redone_steps(answer: object) -> bool:
    """Steps computed again after a death in step 21, checkpoints every 8."""
    return check_number(
        "ch13.redone_steps",
        answer,
        21 - 16,
        hint="the newest checkpoint is after step 16; the group starts at step 17 "
        "and computes 17, 18, ... up to and including the interrupted step",
    )


def check_checkpoint_bytes(answer: object) -> bool:
    """Model and AdamW's moments of 1e7 float32 parameters, whole: a number."""
    return check_number(
        "ch13.checkpoint_bytes",
        answer,
        3 * 4 * 10**7,
        hint="4 bytes a float32; the parameters, and AdamW's exp_avg and exp_avg_sq "
        "of the same shapes, each saved once (DCP deduplicates the replicas)",
    )


def check_accepted_16(answer: object) -> bool:
    """Layouts of 16 ranks `layout.accepted` takes for the stated TinyGPT."""
    cfg = GPTConfig(vocab=64, block_size=32, n_layer=4, n_head=4, n_embd=32)
    return check_number(
        "ch13.accepted_16",
        answer,
        len(accepted(16, cfg, batch=8, micro_batches=2)),
        hint="list the (dp, pp, tp) with dp·pp·tp = 16; tp in 1, 2, 4 (it divides "
        "4 heads); pp in 1, 2, 4 (it divides 4 blocks); dp·m divides 8, with m = 2 "
        "micro-batches where pp > 1 and 1 otherwise",
    )
