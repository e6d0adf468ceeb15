"""One process per node, started by ``srun``, that reads its place from ``SLURM_*`` and spawns
one worker per device on its node; the workers meet through a shared file (``file://`` init
named after the job). The shape of tczhangzhi/pytorch-distributed's
``distributed_slurm_main.py``, on CPU and gloo. Written for ddptui's tests; no ddptui import.

    srun -N NODES --ntasks-per-node 1 python slurm_node.py --dist-file SHARED/PATH

Global rank = ``SLURM_PROCID`` x workers per node + local index; world size = ``SLURM_NTASKS``
x workers per node. CPU edit: workers per node is ``--workers-per-node`` (the original uses
the GPU count). Each epoch, rank 0 appends a row to ``--out``/distributed.csv.
"""

import argparse
import csv
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from facts import report
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

parser = argparse.ArgumentParser(description="one process per node, workers spawned")
parser.add_argument("--dist-file", required=True, help="shared file for the rendezvous")
parser.add_argument("--workers-per-node", default=2, type=int)
parser.add_argument("--out", default=".", help="where distributed.csv goes")
parser.add_argument("--epochs", default=2, type=int)
parser.add_argument("--steps", default=10, type=int, help="steps per epoch")
parser.add_argument("-b", "--batch-size", default=8, type=int)


def main():
    args = parser.parse_args()
    args.node = int(os.environ["SLURM_NODEID"])
    args.proc = int(os.environ["SLURM_PROCID"])
    args.world_size = int(os.environ["SLURM_NTASKS"]) * args.workers_per_node
    job_id = os.environ["SLURM_JOB_ID"]
    args.dist_url = f"file://{os.path.realpath(args.dist_file)}.{job_id}"
    print(f"node {args.node} (task {args.proc}) spawns {args.workers_per_node} workers", flush=True)
    mp.spawn(main_worker, nprocs=args.workers_per_node, args=(args.workers_per_node, args))


def main_worker(local, per_node, args):
    rank = args.proc * per_node + local
    dist.init_process_group(
        backend="gloo", init_method=args.dist_url, world_size=args.world_size, rank=rank
    )
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(args.steps * args.batch_size * args.world_size, 12, generator=gen)
    y = x @ torch.linspace(-1, 1, 12, dtype=x.dtype).unsqueeze(1)
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(
        dataset, batch_size=args.batch_size, shuffle=(sampler is None), sampler=sampler
    )
    model = nn.parallel.DistributedDataParallel(nn.Linear(12, 1))
    optimizer = torch.optim.SGD(model.parameters(), 0.05)
    steps, last_loss, epoch_steps = 0, None, {}
    for epoch in range(args.epochs):
        started = time.time()
        sampler.set_epoch(epoch)
        epoch_steps[epoch] = 0
        for inputs, target in loader:
            loss = nn.functional.mse_loss(model(inputs), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            steps += 1
            epoch_steps[epoch] += 1
            last_loss = loss.item()
        if rank == 0:
            with open(os.path.join(args.out, "distributed.csv"), "a+", newline="") as f:
                csv.writer(f).writerow([time.strftime("%Y-%m-%d %H:%M:%S"), time.time() - started])
    report(dist.get_rank(), dist.get_world_size(), steps, last_loss, epoch_steps)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
