"""Chapter 13 as a script: a GPT learns the book (and the Python it runs on) on
any layout of ranks, or on this machine's one device without torchrun.

    python book/scripts/train_gpt.py --model gpt2-124m --batch 1 --seq 128 --steps 2
    torchrun --nproc-per-node 8 book/scripts/train_gpt.py --dp 2 --pp 2 --tp 2 \
        --micro-batches 2 --dtype bf16 --steps 200 --ckpt-dir ckpt --ckpt-every 50 \
        --metrics run.jsonl --compare
    torchrun --nproc-per-node 8 book/scripts/train_gpt.py --compare-all --dtype bf16

Flags: the layout (--dp --pp --tp --micro-batches (alias --m: with a pipeline its
micro-batches, without one gradient accumulation) --schedule 1f1b|gpipe|
interleaved --virtual --ckpt none|full --zero 1|2|3 --fsdp --dtype float32|
bfloat16; --cp and --ep are refused above 1, by name: not composed here), or
--plan GPU (chapter 10's planner chooses the layout: h100, h200, a100);
the model (--model tiny|gpt2-124m|gpt2-350m|1b, --n-layer (alias --layers)
--n-embd --n-head --seq); the corpus (--corpus chars|bpe: the book as
characters, --excerpt its frozen first 64 KiB, or a byte-level BPE of --vocab
tokens over the book and --corpus-mb of the installed Python, cached under
--cache-dir); the run (--steps --batch --lr --min-lr --warmup --clip --optimizer
sgd|adamw --seed --timeout --no-tf32); checkpoints (--ckpt-dir --ckpt-every
--keep: sharded DCP, atomic; a second run with the same --ckpt-dir resumes, on
any layout); --eval-every --eval-batches (the held-out loss); outputs
(--metrics PATH: JSON lines of loss, tokens/s, MFU, measured and planned peak
memory per rank; --tensorboard DIR; --log-every; --profile DIR: torch.profiler
traces; --memory-snapshot PATH: CUDA's allocator history, on a GPU; --curve
PATH, PNG; --losses PATH, JSON); checks (--compare: against one process;
--compare-all: every layout of the world and every composition; --check: the
layout alone, no rank started); --kill RANK:STEP (a drill: that rank dies by
SIGKILL mid-step on torchrun's first attempt; under `torchrun --max-restarts 1`
the group restarts and resumes from the last checkpoint); --quiet.
Everything lives in distcourse.train (cli.main); this file only starts it.
"""

from distcourse.train.cli import main

if __name__ == "__main__":
    main()
