"""Chapter 8 as a script: the tiny GPT trained on a dp x pp x tp mesh of ranks.

torchrun --nproc-per-node 8 book/scripts/hybrid_train.py --steps 12 --compare

On two machines (here: two "nodes" on one machine's loopback), 4 ranks each:

torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d \
    --rdzv-endpoint HOST:29500 --rdzv-id hybrid book/scripts/hybrid_train.py
on each (c10d numbers the nodes in order of arrival). Rank 0 prints the layout and
the losses; with --compare every rank also runs chapter 8's check
(hybrid.against_one_process: the first step's gradients, then plain SGD's losses
and parameters against one process) and rank 0 prints its verdicts.
"""

import argparse

import torch

from distcourse import runtime
from distcourse.examples.gpt import GPTConfig, TinyGPT, token_batches
from distcourse.parallel import hybrid

parser = argparse.ArgumentParser()
parser.add_argument("--dp", type=int, default=2)
parser.add_argument("--pp", type=int, default=2)
parser.add_argument("--tp", type=int, default=2)
parser.add_argument("--steps", type=int, default=12)
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--micro-batches", type=int, default=2)
parser.add_argument("--compare", action="store_true", help="also train one process")
args = parser.parse_args()

info = runtime.init_from_env()
cfg = GPTConfig()
layout = hybrid.Layout(args.dp, args.pp, args.tp)
mesh = hybrid.make_mesh(layout, cfg)  # a ValueError on every rank if it cannot fit
batches = token_batches(args.steps, args.batch_size, cfg)  # the same on every rank
runtime.seed_everything(0, per_rank=False)  # the same model on every rank
model = TinyGPT(cfg)
net = hybrid.HybridGPT(model, mesh, micro_batches=args.micro_batches)
losses = net.train(batches)
coord = ", ".join(f"{k}={v}" for k, v in mesh.coordinate.items())
if info.rank == 0:
    print(
        f"{layout.name} (dp x pp x tp) on {info.world_size} ranks; rank 0 at "
        f"{coord}; {len(losses)} steps, losses {losses[0]:.4f} -> "
        f"{losses[-1]:.4f}"
    )
net.close()
if args.compare:  # chapter 8's check; plain SGD, since AdamW hides a gradient scale
    found = hybrid.against_one_process(
        layout,
        cfg,
        steps=args.steps,
        batch=args.batch_size,
        micro_batches=args.micro_batches,
    )
    if info.rank == 0:
        print(*hybrid.verdicts(found), sep="\n")
torch.distributed.barrier()
runtime.shutdown()
