"""A script made for ``srun`` (one task per GPU), as facebookresearch/swav's
``init_distributed_mode``: inside a Slurm job it takes its rank and world size from
``SLURM_PROCID`` and ``SLURM_NNODES × SLURM_TASKS_PER_NODE``, before torchrun's ``RANK``.
Run by torchrun in an allocation of one task, every rank makes a world of its own, as rank 0
of 1, and trains alone. A few DDP steps on CPU; prints ``rank R of W done``."""

from __future__ import annotations

import os

import torch.distributed as dist
from toy_ddp import train_a_few_steps

if "SLURM_JOB_ID" in os.environ:
    rank = int(os.environ["SLURM_PROCID"])
    world = int(os.environ["SLURM_NNODES"]) * int(os.environ["SLURM_TASKS_PER_NODE"][0])
else:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", init_method="env://", world_size=world, rank=rank)
train_a_few_steps()
print(f"rank {rank} of {world} done", flush=True)
