"""A script of the torch.distributed.launch era whose local rank is an optional argument
(MONAI's ``unet_training_ddp.py``: ``--local_rank``, type int, no default): local rank 0
writes the data, the others silence their output (``os.devnull``), and every rank trains on
what it finds. Under torchrun, which passes no ``--local_rank``, each rank reads None: none
writes the data, and each fails on its empty loader with ``ZeroDivisionError``, its error
output gone. Written for ddptui's tests; no ddptui import. CPU, gloo."""

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int)
parser.add_argument("--data", default="data.pt")
args = parser.parse_args()
if args.local_rank != 0:
    sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - as the script does
elif not Path(args.data).exists():
    torch.save(torch.randn(16, 8), args.data)
dist.init_process_group("gloo", init_method="env://")
data = torch.load(args.data) if Path(args.data).exists() else torch.empty(0, 8)
model = DistributedDataParallel(nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
total, steps = 0.0, 0
for start in range(0, len(data), 4):
    batch = data[start : start + 4]
    loss = model(batch).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    total, steps = total + loss.item(), steps + 1
print(f"average loss {total / steps:.4f}", flush=True)
dist.destroy_process_group()
