"""Chapter 1 as a script: the digits MLP trained with torch DDP on every rank.

torchrun --nproc-per-node 2 book/scripts/quickstart_ddp.py --epochs 5
"""

import argparse

import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from distcourse import accelerator, runtime
from distcourse.examples import datasets, models, train

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--batch-size", type=int, default=32)
args = parser.parse_args()

info = runtime.init_from_env()
runtime.seed_everything(0, per_rank=False)  # identical initial weights on every rank
model = models.digits_mlp().to(info.device)
ddp = DDP(model, device_ids=accelerator.ddp_device_ids(info.device))  # [i] on a GPU

train_set, test_set = datasets.digits(train=True), datasets.digits(train=False)
sampler = DistributedSampler(train_set, info.world_size, info.rank, seed=0)
loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)

losses = train.fit(ddp, loader, optimizer, args.epochs, info.device)
runtime.print_in_order(f"{len(losses)} steps, last loss {losses[-1]:.4f}")
if info.rank == 0:
    print(f"test accuracy {train.accuracy(model, test_set, info.device):.1%}")
runtime.shutdown()
