"""Uneven inputs under DDP's ``Join`` context manager, the shape of PyTorch's "Distributed
Training with Uneven Inputs Using the Join Context Manager" tutorial: each rank reads its own
shard, of its own length, and the ranks that run out of batches first shadow the others'
all-reduces inside ``Join`` until the last rank is done. Here rank 0 runs out after
``--batches`` batches and waits in ``Join`` while rank 1 trains ``--extra`` batches more (an
I/O-bound loader: ``--wait`` seconds a batch): a rank idle but healthy for longer than the
hang timeout. Written for ddptui's tests; no ddptui import.

    torchrun --nproc-per-node 2 uneven_join.py [--batches 6] [--extra 40] [--wait 0.1]
"""

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from facts import report
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP


def shard(rank: int, batches: int, batch_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(rank)
    out = []
    for _ in range(batches):
        x = torch.randn(batch_size, 8, generator=gen)
        out.append((x, x.sum(dim=1, keepdim=True)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--extra", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--wait", type=float, default=0.1)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = shard(rank, args.batches + rank * args.extra, args.batch_size)
    steps, last_loss = 0, None
    with Join([model]):
        for x, y in data:
            time.sleep(args.wait)  # the shard's reader
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            steps += 1
            last_loss = loss.item()
    report(rank, world, steps, last_loss, {}, samples=steps * args.batch_size)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
