"""Chapter 4 as a script: the tiny GPT trained tensor-parallel, beside one process.

torchrun --nproc-per-node 2 book/scripts/tp_train.py --steps 30 [--sequence-parallel]

Every rank holds 1/N of each split layer; all ranks print the same losses, and
they are one process's losses (which rank 0 also computes, with --compare).
"""

import argparse

from distcourse import runtime
from distcourse.examples.gpt import GPTConfig, TinyGPT, token_batches, train_lm
from distcourse.parallel.tensor import (
    parallelize_gpt,
    save_checkpoint,
    vocab_parallel_cross_entropy,
)

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--sequence-parallel", action="store_true")
parser.add_argument("--compare", action="store_true", help="also train one process")
parser.add_argument("--save", default=None, help="write the full checkpoint here")
args = parser.parse_args()

info = runtime.init_from_env()
cfg = GPTConfig()
batches = [  # the same on every rank, on its device
    (x.to(info.device), y.to(info.device))
    for x, y in token_batches(args.steps, args.batch_size, cfg)
]
runtime.seed_everything(0, per_rank=False)  # the same model on every rank
model = TinyGPT(cfg).to(info.device)
twin = parallelize_gpt(model, sequence_parallel=args.sequence_parallel)
losses = train_lm(twin, batches, vocab_parallel_cross_entropy)
held = sum(p.numel() for p in twin.parameters())
runtime.print_in_order(
    f"TP={info.world_size}: {len(losses)} steps, losses {losses[0]:.4f} -> "
    f"{losses[-1]:.4f}, {held:,} of {sum(p.numel() for p in model.parameters()):,} "
    "parameters on this rank"
)
if args.save:
    save_checkpoint(twin, args.save)
if args.compare and info.rank == 0:
    alone = train_lm(model, batches)
    same = all(f"{a:.4f}" == f"{b:.4f}" for a, b in zip(alone, losses, strict=True))
    print(f"one process: losses {alone[0]:.4f} -> {alone[-1]:.4f}")
    print(f"every loss equal to 4 decimals: {same}")
runtime.shutdown()
