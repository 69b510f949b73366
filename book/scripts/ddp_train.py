"""Chapter 3 as a script: the digits MLP trained data-parallel, with our DDP or torch's.

torchrun --nproc-per-node 2 book/scripts/ddp_train.py --impl ours --epochs 2

Both implementations print the same losses: they average the same gradients.
"""

import argparse

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from distcourse import accelerator, runtime
from distcourse.examples import datasets, models, train
from distcourse.parallel import replicas
from distcourse.parallel.ddp import DDP

parser = argparse.ArgumentParser()
parser.add_argument("--impl", choices=["ours", "torch"], default="ours")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch-size", type=int, default=32, help="per rank")
parser.add_argument("--bucket-mb", type=float, default=0.002, help="ours only")
args = parser.parse_args()

info = runtime.init_from_env()
runtime.seed_everything(0, per_rank=False)  # identical initial weights on every rank
model = models.digits_mlp().to(info.device)
if args.impl == "ours":
    net = DDP(model, bucket_cap_mb=args.bucket_mb)
else:
    ids = accelerator.ddp_device_ids(info.device)  # [its index] on a GPU, else None
    net = DistributedDataParallel(model, device_ids=ids)

train_set, test_set = datasets.digits(train=True), datasets.digits(train=False)
sampler = DistributedSampler(train_set, info.world_size, info.rank, seed=0)
loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

losses = train.fit(net, loader, optimizer, args.epochs, info.device)  # set_epoch inside
same = replicas.same_on_all_ranks(model)
runtime.print_in_order(
    f"{args.impl} DDP: {len(losses)} steps, losses {losses[0]:.4f} -> "
    f"{losses[-1]:.4f}, parameters identical on all ranks: {same}"
)
if info.rank == 0:
    print(f"global batch {info.world_size * args.batch_size}")
    print(f"test accuracy {train.accuracy(model, test_set, info.device):.1%}")
del net  # torch's DDP keeps the group alive: let go of it before the group closes
runtime.shutdown()
