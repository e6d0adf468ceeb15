"""A script of the torch.distributed.launch era (Swin Transformer's ``main.py`` and its kin):
its local rank is a required argument, as ``python -m torch.distributed.launch`` passed it,
and the rest comes from the environment (env://). Written for ddptui's tests; no ddptui
import. CPU, gloo: a linear model, ``--steps`` steps."""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, required=True, help="local rank for DDP")
parser.add_argument("--steps", type=int, default=20)
args = parser.parse_args()
dist.init_process_group("gloo", init_method="env://")
print(f"rank {dist.get_rank()}: local rank {args.local_rank} of LOCAL_RANK "
      f"{os.environ['LOCAL_RANK']}", flush=True)  # fmt: skip
model = DistributedDataParallel(nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(args.steps):
    loss = model(torch.randn(4, 8)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
dist.destroy_process_group()
