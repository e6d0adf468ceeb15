"""The few DDP steps on CPU that ddptui's small test scripts train (imported by them, from
their own directory; no ddptui import)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def train_a_few_steps(steps: int = 3) -> None:
    """A linear model in DDP over the process group formed already, ``steps`` SGD steps on
    random data; then the group is destroyed."""
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()
