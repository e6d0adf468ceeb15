"""A user's own DDP script, as one would write it for plain torchrun, reporting to ddptui.

Options: --steps N, --fail-rank R (raise on that rank), --hang (sleep forever after steps).
"""

import argparse
import os
import time

import torch
import torch.distributed as dist

import ddptui

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--fail-rank", type=int, default=-1)
parser.add_argument("--sleep", type=float, default=0.0)
args = parser.parse_args()

dist.init_process_group("gloo")  # env:// from the launcher
rank, world = dist.get_rank(), dist.get_world_size()
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
try:
    for step in range(args.steps):
        x = torch.randn(8, 4)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        ddptui.log(epoch=1, loss=loss.item(), samples=len(x), lr=0.1)
        if rank == args.fail_rank and step == args.steps // 2:
            raise RuntimeError(f"boom on rank {rank}")
        time.sleep(args.sleep)
    correct = torch.tensor([float(rank + 1)])
    dist.all_reduce(correct)
    ddptui.log_eval(epoch=1, accuracy=correct.item() / (world * (world + 1) / 2), count=world)
    print(f"rank {rank} done pid {os.getpid()} threads {torch.get_num_threads()}", flush=True)
finally:
    dist.destroy_process_group()
