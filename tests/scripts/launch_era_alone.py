"""A script of the torch.distributed.launch era that forms its process group only when given
its local rank (opacus's ``examples/cifar10.py``: ``--local_rank``, default -1, and
``init_process_group`` only where it is not -1). Under torchrun, which passes no
``--local_rank``, every rank reads -1 and trains the whole dataset alone, and the run ends
as if it had trained together. Written for ddptui's tests; no ddptui import. CPU, gloo."""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=-1)
parser.add_argument("--steps", type=int, default=6)
args = parser.parse_args()
model: nn.Module = nn.Linear(8, 2)
if args.local_rank != -1:
    dist.init_process_group("gloo", init_method="env://")
    model = DistributedDataParallel(model)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
torch.manual_seed(0)
data = torch.randn(4 * args.steps, 8)
for start in range(0, len(data), 4):
    loss = model(data[start : start + 4]).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print(f"trained {args.steps} steps, local rank {args.local_rank}", flush=True)
if args.local_rank != -1:
    dist.destroy_process_group()
