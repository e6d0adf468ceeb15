"""One training step and done: the shape of pytorch/examples' ``distributed/ddp/example.py``
(print the rendezvous environment, init from it, a toy model, a single forward / backward /
optimizer step, destroy the group), on CPU and gloo. No sampler, so no epochs. Written for
ddptui's tests; no ddptui import.

    torchrun --nproc-per-node 2 one_step.py [--local_world_size 2]
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from facts import report
from torch.nn.parallel import DistributedDataParallel as DDP


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def demo_basic(local_world_size, local_rank):
    print(
        f"[{os.getpid()}] rank = {dist.get_rank()}, world_size = {dist.get_world_size()}",
        flush=True,
    )
    torch.manual_seed(dist.get_rank())
    ddp_model = DDP(ToyModel())
    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)
    optimizer.zero_grad()
    outputs = ddp_model(torch.randn(20, 10))
    labels = torch.randn(20, 5)
    loss = loss_fn(outputs, labels)
    loss.backward()
    optimizer.step()
    report(dist.get_rank(), dist.get_world_size(), 1, loss.item(), {})


def spmd_main(local_world_size, local_rank):
    env_dict = {
        key: os.environ[key] for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")
    }
    print(f"[{os.getpid()}] Initializing process group with: {env_dict}", flush=True)
    dist.init_process_group(backend="gloo")
    print(
        f"[{os.getpid()}]: world_size = {dist.get_world_size()}, rank = {dist.get_rank()}, "
        f"backend={dist.get_backend()}",
        flush=True,
    )
    demo_basic(local_world_size, local_rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))
    parser.add_argument("--local_world_size", type=int, default=1)
    args = parser.parse_args()
    spmd_main(args.local_world_size, args.local_rank)
