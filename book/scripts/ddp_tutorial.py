"""PyTorch's DDP tutorial, its three programs as written there, on the CPU.

pytorch.org/tutorials/intermediate/ddp_tutorial.html: the basic example, saving and
loading a checkpoint, and DDP with a model split over two devices. Lines marked
`# book:` are ours: the CPU where the tutorial uses GPU `rank`, a port the caller may
pick, seeds, and `report`, which prints and saves what each rank ends with so that two
runs can be compared. Swap the DDP import for `from distcourse.parallel.ddp import DDP`
and the numbers stay the same (tests/test_parallel_ddp_tutorial.py).

    python book/scripts/ddp_tutorial.py [basic] [checkpoint] [model_parallel]
"""

# The tutorial's own style (super(Class, self), "%d" %), kept as written there.
# ruff: noqa: UP008, UP031

import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP

DEVICE = "cpu"  # book: the tutorial puts rank r on GPU r, `.to(rank)`


def setup(rank, world_size):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = os.environ.get("MASTER_PORT", "12355")  # book: pick

    # initialize the process group
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def cleanup():
    dist.destroy_process_group()


def report(demo, rank, model, loss):  # book: what this rank ends with
    total = sum(p.sum().item() for p in model.parameters())
    print(f"{demo} rank {rank}: loss {loss.item():.4f}, sum of parameters {total:.4f}")
    if "TUTORIAL_OUT" in os.environ:  # the test compares these files bit for bit
        path = os.path.join(os.environ["TUTORIAL_OUT"], f"{demo}-{rank}.pt")
        torch.save(model.state_dict(), path)


class ToyModel(nn.Module):
    def __init__(self):
        super(ToyModel, self).__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def demo_basic(rank, world_size):
    print(f"Running basic DDP example on rank {rank}.")
    setup(rank, world_size)
    torch.manual_seed(rank)  # book: each rank its own weights and data, repeatably

    # create model and move it to GPU with id rank
    model = ToyModel().to(DEVICE)  # book: .to(rank)
    ddp_model = DDP(model, device_ids=None)  # book: device_ids=[rank] on GPU rank

    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)

    optimizer.zero_grad()
    outputs = ddp_model(torch.randn(20, 10))
    labels = torch.randn(20, 5).to(DEVICE)  # book: .to(rank)
    loss = loss_fn(outputs, labels)  # book: named, for report
    loss.backward()
    optimizer.step()
    report("basic", rank, ddp_model.module, loss)  # book

    cleanup()
    print(f"Finished running basic DDP example on rank {rank}.")


def demo_checkpoint(rank, world_size):
    print(f"Running DDP checkpoint example on rank {rank}.")
    setup(rank, world_size)
    torch.manual_seed(rank)  # book

    model = ToyModel().to(DEVICE)  # book: .to(rank)
    ddp_model = DDP(model, device_ids=None)  # book: device_ids=[rank]

    CHECKPOINT_PATH = tempfile.gettempdir() + "/model.checkpoint"
    if rank == 0:
        # All processes should see same parameters as they all start from same
        # random parameters and gradients are synchronized in backward passes.
        # Therefore, saving it in one process is sufficient.
        torch.save(ddp_model.state_dict(), CHECKPOINT_PATH)

    # Use a barrier() to make sure that process 1 loads the model after process
    # 0 saves it.
    dist.barrier()
    # configure map_location properly
    map_location = {"cuda:%d" % 0: "cuda:%d" % rank}
    ddp_model.load_state_dict(
        torch.load(CHECKPOINT_PATH, map_location=map_location, weights_only=True)
    )

    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)

    optimizer.zero_grad()
    outputs = ddp_model(torch.randn(20, 10))
    labels = torch.randn(20, 5).to(DEVICE)  # book: .to(rank)
    loss = loss_fn(outputs, labels)  # book: named, for report
    loss.backward()
    optimizer.step()
    report("checkpoint", rank, ddp_model.module, loss)  # book

    # Not necessary to use a dist.barrier() to guard the file deletion below
    # as the AllReduce ops in the backward pass of DDP already served as
    # a synchronization.

    if rank == 0:
        os.remove(CHECKPOINT_PATH)

    cleanup()
    print(f"Finished running DDP checkpoint example on rank {rank}.")


class ToyMpModel(nn.Module):
    def __init__(self, dev0, dev1):
        super(ToyMpModel, self).__init__()
        self.dev0 = dev0
        self.dev1 = dev1
        self.net1 = torch.nn.Linear(10, 10).to(dev0)
        self.relu = torch.nn.ReLU()
        self.net2 = torch.nn.Linear(10, 5).to(dev1)

    def forward(self, x):
        x = x.to(self.dev0)
        x = self.relu(self.net1(x))
        x = x.to(self.dev1)
        return self.net2(x)


def demo_model_parallel(rank, world_size):
    print(f"Running DDP with model parallel example on rank {rank}.")
    setup(rank, world_size)
    torch.manual_seed(rank)  # book

    # setup mp_model and devices for this process
    dev0 = DEVICE  # book: GPU rank * 2
    dev1 = DEVICE  # book: GPU rank * 2 + 1
    mp_model = ToyMpModel(dev0, dev1)
    ddp_mp_model = DDP(mp_model)

    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_mp_model.parameters(), lr=0.001)

    optimizer.zero_grad()
    # outputs will be on dev1
    outputs = ddp_mp_model(torch.randn(20, 10))
    labels = torch.randn(20, 5).to(dev1)
    loss = loss_fn(outputs, labels)  # book: named, for report
    loss.backward()
    optimizer.step()
    report("model_parallel", rank, ddp_mp_model.module, loss)  # book

    cleanup()
    print(f"Finished running DDP with model parallel example on rank {rank}.")


def run_demo(demo_fn, world_size):
    mp.spawn(demo_fn, args=(world_size,), nprocs=world_size, join=True)


if __name__ == "__main__":
    demos = sys.argv[1:] or ["basic", "checkpoint", "model_parallel"]  # book
    world_size = 2  # book: the number of GPUs (half of it for model_parallel)
    for name in demos:
        run_demo(globals()[f"demo_{name}"], world_size)
