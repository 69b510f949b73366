"""Chapter 5's experiment: PyTorch's model-parallel tutorial, ResNet-50 split after
layer2 over two ranks, naive and pipelined, with the tutorial's split-size sweep.

torchrun --nproc-per-node 2 book/scripts/pipeline_resnet.py           # full sizes
torchrun --nproc-per-node 2 book/scripts/pipeline_resnet.py --small   # seconds, CPU
    ... --json: rank 0 ends with one JSON line (the notebook plots it)

The tutorial trains 3 batches of 120 random 128x128 images, 1000 classes, MSE on
one-hot labels, SGD (lr 0.001), and reports: one GPU 3.75 s, model parallel 4.02 s,
pipelined with split size 20 2.51 s, best split 12 2.43 s. Here each half is a rank
(on a CPU box one core each: one process cannot run two halves at once on CPU), and
the micro-batches follow GPipe's schedule: split size s gives m = batch / s
micro-batches; m = 1 (the whole batch) is the naive split. Full sizes are meant
for a GPU box; --small runs a one-block-per-layer ResNet on 64x64 images, 48 to a
batch: on one core per rank its two halves take about as long as each other at
the middle of the sweep, and a micro-batch of 12 images is enough work that the
pipe's overlap outweighs what each micro-batch costs beyond its images. Each
timing follows one untimed step: a process's first step pays one-off costs (lazy
imports, allocator warm-up) that would otherwise land on whichever row ran first.

Each row also gives, per stage, the milliseconds of compute (forward + backward)
per micro-batch, averaged over the last timed step's events: the notebook fits
them with a fixed cost per micro-batch plus a cost per image.
"""

import argparse
import json
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torchvision.models.resnet import BasicBlock, Bottleneck, ResNet

from distcourse import runtime
from distcourse.parallel import pipeline as pp

parser = argparse.ArgumentParser()
parser.add_argument("--small", action="store_true", help="a small ResNet, 32x32")
parser.add_argument("--repeats", type=int, default=1, help="best of this many runs")
parser.add_argument("--json", action="store_true", help="then a JSON line")
args = parser.parse_args()
if args.small:
    blocks, layers, classes, image, batch = BasicBlock, [1, 1, 1, 1], 10, 96, 32
    sweep = [2, 4, 8, 16]  # BatchNorm needs 2 samples at layer4's 3x3
else:  # the tutorial's sizes
    blocks, layers, classes, image, batch = Bottleneck, [3, 4, 6, 3], 1000, 128, 120
    sweep = [1, 3, 5, 8, 10, 12, 20, 40, 60]
BATCHES = 3

info = runtime.init_from_env(timeout=120)
dev = info.device


def resnet() -> nn.Sequential:
    """The ResNet as a sequence; cut after layer2 (6 children) as the tutorial does."""
    torch.manual_seed(0)
    r = ResNet(blocks, layers, num_classes=classes)
    first = [r.conv1, r.bn1, r.relu, r.maxpool, r.layer1, r.layer2]  # the cut
    second = [r.layer3, r.layer4, r.avgpool, nn.Flatten(), r.fc]
    return nn.Sequential(*first, *second)


def data() -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(batch, 3, image, image, device=dev)
    labels = torch.randint(0, classes, (batch,), device=dev)
    return x, F.one_hot(labels, classes).float()


def train(step, params) -> float:  # noqa: ANN001
    """Seconds for BATCHES training steps (slowest rank), best of --repeats."""
    best = float("inf")
    optimizer = torch.optim.SGD(params, lr=0.001)
    step(*data())  # untimed: one-off costs of a first step
    optimizer.zero_grad()
    for _ in range(args.repeats):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(BATCHES):
            optimizer.zero_grad()
            step(*data())
            optimizer.step()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        took = torch.tensor([time.perf_counter() - start], device=dev)
        dist.all_reduce(took, op=dist.ReduceOp.MAX)
        best = min(best, took.item())
    return best


# one process: rank 0 trains the whole model while rank 1 waits at the barrier
single = resnet().to(dev)
if info.rank == 0:
    opt = torch.optim.SGD(single.parameters(), lr=0.001)
    F.mse_loss(single(data()[0]), data()[1]).backward()  # untimed, as in train()
    opt.zero_grad()
    start = time.perf_counter()
    for _ in range(BATCHES):
        opt.zero_grad()
        x, y = data()
        F.mse_loss(single(x), y).backward()
        opt.step()
    one = time.perf_counter() - start
dist.barrier()

rows = []
for split in [batch, *sweep]:  # the whole batch first: the naive split
    stages = [s.to(dev) for s in pp.split_at(resnet(), [0, 6, 11])]
    pipe = pp.Pipeline(stages, pp.gpipe(2, batch // split), F.mse_loss, timeout=120)
    mine = [p for s in pipe.local.values() for p in s.parameters()]
    took = train(pipe.step, mine)
    busy = sum(e.end - e.start for e in pipe.events)  # the last step's compute
    per_micro = torch.tensor([1000 * busy / (batch // split)], device=dev)
    stage_ms = [torch.zeros_like(per_micro) for _ in range(2)]
    dist.all_gather(stage_ms, per_micro)  # rank r holds stage r
    rows.append((split, batch // split, took, [t.item() for t in stage_ms]))
    pipe.close()

if info.rank == 0:
    naive = rows[0][2]
    print(
        f"ResNet {'small' if args.small else '50'}: {BATCHES} batches of {batch} "
        f"images {image}x{image}, {classes} classes, on {dev.type}"
    )
    print(f"one process {one:.2f} s")
    head = ("split", "m", "seconds", "vs naive", "stage 0 ms", "stage 1 ms")
    print(
        " ".join(f"{h:>{w}}" for h, w in zip(head, (5, 4, 8, 8, 10, 10), strict=True))
    )
    for split, m, t, (ms0, ms1) in rows:  # ms: compute per micro-batch
        print(
            f"{split:>5} {m:>4} {t:>8.2f} {naive / t:>7.2f}x {ms0:>10.1f} {ms1:>10.1f}"
        )
    best = min(rows[1:], key=lambda r: r[2])
    print(f"best split size {best[0]}: {naive / best[2]:.2f}x the naive split")
if info.rank == 0 and args.json:  # last: the line the notebook reads
    shape = dict(small=args.small, batches=BATCHES, batch=batch, image=image)
    print(json.dumps(dict(shape, one=one, rows=rows)))
runtime.shutdown()
