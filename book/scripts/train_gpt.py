"""Chapter 13 as a script: a TinyGPT learns the book's own text on any layout.

torchrun --nproc-per-node 8 book/scripts/train_gpt.py --dp 2 --pp 2 --tp 2 \
    --micro-batches 2 --steps 200 --ckpt-dir ckpt --ckpt-every 50 \
    --curve loss.png --compare

Flags: the layout (--dp --pp --tp --micro-batches (alias --m, which torchrun's
own parser refuses as ambiguous) --schedule 1f1b|gpipe --ckpt --zero/--fsdp
--dtype; --cp and --ep are refused above 1, by name: not composed here), or
--plan GPU: chapter 10's planner chooses it, the fastest layout it predicts on
that datasheet GPU (h100, h200, a100) for WORLD_SIZE ranks that this trainer
runs; the layout flags then stay at their defaults),
the run (--steps --batch --seq --lr --optimizer sgd|adamw --warmup --seed
--layers), checkpoints (--ckpt-dir, --ckpt-every: DCP, atomic; a second run with
the same --ckpt-dir resumes, on any layout), --compare (against one process),
--curve PATH (the loss curve, PNG), --losses PATH (every step's loss, JSON,
resumed ones too), --kill RANK:STEP (a drill: that rank dies by SIGKILL mid-step
on torchrun's first attempt; under `torchrun --max-restarts 1` the group
restarts and resumes from the last checkpoint), --excerpt (the package's frozen
excerpt of the book, not --book: chapter 13's stored outputs), --quiet (no
progress bar),
--check (check the layout and start no rank:
`python book/scripts/train_gpt.py --check ...`).
Everything lives in distcourse.train (cli.main); this file only starts it.
"""

from distcourse.train.cli import main

if __name__ == "__main__":
    main()
