"""One process that starts a ``torch.multiprocessing.Process`` per rank, each setting
``MASTER_ADDR``/``MASTER_PORT`` and forming the process group itself (env://, gloo), with a
dataset partitioned by hand and the gradients averaged by the script's own ``all_reduce``
(no DDP module): the shape of the "Distributed Training" section of PyTorch's "Writing
Distributed Applications with PyTorch" tutorial (seba-1511/dist_tuto.pth's ``train_dist.py``),
run as ``python process_workers.py`` (or by a launcher with one process), on CPU. Written for
ddptui's tests; no ddptui import.

    python process_workers.py [--size 2] [--port 29500] [--epochs 3] [--out DIR] [--subclass]
                              [--start-method spawn] [--exit-zero] [--no-join]

``--subclass``: each rank is a ``Process`` subclass that overrides ``run()`` (no target),
the other common way to write a process per rank. ``--start-method``: the script first calls
``torch.multiprocessing.set_start_method`` with it, as harveyp123/Pytorch-DDP-Example's
``mnist_ddp.py`` does (``"spawn"``) before starting its ``Process`` per GPU. ``--exit-zero``:
the script ends as the tutorial's does, joining its processes without a look at their exit
codes, so it exits 0 whatever they did (without it, with the highest of them). ``--no-join``:
the script's main module ends once its processes have started, as facebookresearch/ijepa's
``main.py`` does; Python's exit joins them (the script exits 0).

A fault for the tests (environment): ``RW_FAULT=raise`` makes rank ``RW_FAULT_RANK`` raise just
before its step ``RW_FAULT_STEP`` (counted from 1).

Before its ranks start, the parent runs a helper ``Process`` that writes the data (a download
step's shape) and forms no process group: a process the script starts that is not a rank.
CPU edits: a small MLP on random data written by the helper (the tutorial reads MNIST).
"""

import argparse
import os
from math import ceil
from random import Random

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from facts import report
from torch.multiprocessing import Process

parser = argparse.ArgumentParser(description="ranks started with multiprocessing.Process")
parser.add_argument("--size", default=2, type=int, help="ranks to start")
parser.add_argument("--port", default="29500", type=str)
parser.add_argument("--epochs", default=3, type=int)
parser.add_argument("--batch", default=32, type=int, help="the batch of all ranks together")
parser.add_argument("--samples", default=256, type=int)
parser.add_argument("--out", default=".", type=str)
parser.add_argument("--subclass", action="store_true", help="ranks as a Process subclass")
parser.add_argument("--start-method", help="set_start_method(...) before any process starts")
parser.add_argument("--exit-zero", action="store_true", help="exit 0 whatever the ranks did")
parser.add_argument("--no-join", action="store_true", help="end without joining the ranks")


class Partition:
    """Dataset-like object, but only access a subset of it."""

    def __init__(self, data, index):
        self.data = data
        self.index = index

    def __len__(self):
        return len(self.index)

    def __getitem__(self, index):
        return self.data[self.index[index]]


class DataPartitioner:
    """Partitions a dataset into different chunks."""

    def __init__(self, data, sizes, seed=1234):
        self.data = data
        self.partitions = []
        rng = Random()
        rng.seed(seed)
        indexes = list(range(len(data)))
        rng.shuffle(indexes)
        for frac in sizes:
            part_len = int(frac * len(data))
            self.partitions.append(indexes[0:part_len])
            indexes = indexes[part_len:]

    def use(self, partition):
        return Partition(self.data, self.partitions[partition])


def write_data(path, samples):
    """The helper's work: the data every rank reads (a download, in the tutorial)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(samples, 16, generator=gen)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    torch.save((x, y), path)
    print(f"helper {os.getpid()} wrote {path}", flush=True)


def partition_dataset(args):
    x, y = torch.load(os.path.join(args.out, "data.pt"))
    dataset = list(zip(x, y, strict=True))
    size = dist.get_world_size()
    bsz = args.batch // size
    partition = DataPartitioner(dataset, [1.0 / size for _ in range(size)])
    partition = partition.use(dist.get_rank())
    train_set = torch.utils.data.DataLoader(partition, batch_size=bsz, shuffle=True)
    return train_set, bsz


def average_gradients(model):
    """Gradient averaging."""
    size = float(dist.get_world_size())
    for param in model.parameters():
        dist.all_reduce(param.grad.data, op=dist.ReduceOp.SUM)
        param.grad.data /= size


def run(rank, size, args, helper_pid):
    """Distributed synchronous SGD."""
    torch.manual_seed(1234)
    train_set, bsz = partition_dataset(args)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)
    num_batches = ceil(len(train_set.dataset) / float(bsz))
    steps, last_loss, epoch_steps = 0, None, {}
    for epoch in range(args.epochs):
        epoch_loss = 0.0
        epoch_steps[epoch] = 0
        for data, target in train_set:
            if os.environ.get("RW_FAULT") == "raise" and rank == int(os.environ["RW_FAULT_RANK"]):
                if steps + 1 == int(os.environ["RW_FAULT_STEP"]):
                    raise RuntimeError(f"injected failure on rank {rank} at step {steps + 1}")
            optimizer.zero_grad()
            loss = F.cross_entropy(model(data), target)
            epoch_loss += loss.item()
            loss.backward()
            average_gradients(model)
            optimizer.step()
            steps += 1
            epoch_steps[epoch] += 1
            last_loss = loss.item()
        print("Rank ", dist.get_rank(), ", epoch ", epoch, ": ", epoch_loss / num_batches)
    threads = torch.get_num_threads()
    report(rank, size, steps, last_loss, epoch_steps, pid=os.getpid(), helper_pid=helper_pid,
           threads=threads, start_method=mp.get_start_method())  # fmt: skip
    dist.destroy_process_group()


def init_process(rank, size, fn, args, helper_pid, backend="gloo"):
    """Initialize the distributed environment."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = args.port
    dist.init_process_group(backend, rank=rank, world_size=size)
    fn(rank, size, args, helper_pid)


class Worker(Process):
    """One rank: its work in ``run()``, as a subclass of ``Process`` writes it."""

    def __init__(self, rank, size, args, helper_pid):
        super().__init__()
        self.rank, self.size, self.args, self.helper_pid = rank, size, args, helper_pid

    def run(self):
        init_process(self.rank, self.size, run, self.args, self.helper_pid)


if __name__ == "__main__":
    args = parser.parse_args()
    if args.start_method:
        mp.set_start_method(args.start_method)
    helper = Process(target=write_data, args=(os.path.join(args.out, "data.pt"), args.samples))
    helper.start()
    helper.join()
    processes = []
    for rank in range(args.size):
        if args.subclass:
            p = Worker(rank, args.size, args, helper.pid)
        else:
            p = Process(target=init_process, args=(rank, args.size, run, args, helper.pid))
        p.start()
        processes.append(p)
    if not args.no_join:  # without: the interpreter's exit joins them
        for p in processes:
            p.join()
        if not args.exit_zero:
            raise SystemExit(max(p.exitcode for p in processes))
