"""One process that ``mp.spawn``s two workers which meet at the endpoint they inherited, the
way PyTorch Lightning's ``ddp_spawn`` does under torchrun: ``MASTER_ADDR``/``MASTER_PORT`` as
torchrun set them, env:// through ``torch.distributed.init_process_group`` (the module's
attribute), a few DDP steps on CPU. Prints ``worker R done`` from each worker.

``--own-port PORT``: the process sets ``MASTER_ADDR`` 127.0.0.1 and ``MASTER_PORT`` PORT
itself before it spawns, as yangkky/distributed_tutorial's ``mnist-distributed.py`` does
(its workers' rank 0 then serves the store there, as under ``python script.py``)."""

from __future__ import annotations

import os

import torch.distributed as dist
import torch.multiprocessing as mp
from toy_ddp import train_a_few_steps

WORKERS = 2


def worker(index: int) -> None:
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(index), str(WORKERS)
    dist.init_process_group("gloo")  # env:// at the inherited MASTER_ADDR:MASTER_PORT
    train_a_few_steps()
    print(f"worker {index} done", flush=True)


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["--own-port"]:
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", sys.argv[2]
    mp.spawn(worker, nprocs=WORKERS)
