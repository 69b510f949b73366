"""Chapter 8 as a script: the tiny GPT trained on a dp x pp x tp mesh of ranks.

torchrun --nproc-per-node 8 book/scripts/hybrid_train.py --steps 12 --compare

On two machines (here: two "nodes" on one machine's loopback), 4 ranks each:

torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d \
    --rdzv-endpoint HOST:29500 --rdzv-id hybrid book/scripts/hybrid_train.py
on each (c10d numbers the nodes in order of arrival). Rank 0 prints the layout and
the losses; with --compare every rank also trains one process and rank 0 prints
whether the losses and the parameters agree.
"""

import argparse

import torch

from distcourse import checks, runtime
from distcourse.examples.gpt import GPTConfig, TinyGPT, token_batches, train_lm
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
    print(f"{layout.name} (dp x pp x tp) on {info.world_size} ranks; rank 0 at "
          f"{coord}; {len(losses)} steps, losses {losses[0]:.4f} -> "
          f"{losses[-1]:.4f}")  # fmt: skip
if args.compare:
    mine = net.one_process_state()  # every rank: its stage, slices gathered
    alone = train_lm(model, batches)
    loss_diff = max(abs(a - b) for a, b in zip(losses, alone, strict=True))
    want = model.state_dict()
    param_diff = max(
        (mine[k].cpu() - want[k]).abs().max().item()
        for k in mine
        if not k.endswith("key.bias")  # true gradient 0: noise only (chapter 4)
    )
    param_diff = checks.max_over_ranks(param_diff)
    if info.rank == 0:
        print(f"one process: losses {alone[0]:.4f} -> {alone[-1]:.4f}")
        print(f"losses: {checks.verdict(loss_diff, 1e-5)}")
        print(f"parameters: {checks.verdict(param_diff, 1e-4)}")
net.close()
torch.distributed.barrier()
runtime.shutdown()
