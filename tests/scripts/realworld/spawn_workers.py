"""One process that ``mp.spawn``s its own workers, which form the process group themselves
(tcp:// init, rank = the spawn index): the shape of tczhangzhi/pytorch-distributed's
``multiprocessing_distributed.py``, run as ``python spawn_workers.py`` (or by a launcher with
one process), on CPU and gloo. Written for ddptui's tests; no ddptui import.

    python spawn_workers.py [--nprocs 2] [--dist-url tcp://127.0.0.1:23456] [--epochs 2]
                            [--start-method fork]

CPU edit: the number of workers is ``--nprocs`` (the original spawns one per visible GPU).
``init_process_group`` is imported by name at the top, as pytorch/examples'
``ddp-tutorial-series/multigpu.py`` does: a worker binds it while it imports the script to
unpickle its function, before anything in the worker could wrap ``torch.distributed``'s.

A fault for the tests (environment): ``RW_FAULT=raise`` makes worker ``RW_FAULT_RANK`` raise
just before its step ``RW_FAULT_STEP`` (counted from 1); mp.spawn's wrapper catches it and the
spawner raises "Process 1 terminated with the following error".
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from facts import report
from torch.distributed import init_process_group
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

parser = argparse.ArgumentParser(description="spawned DDP workers")
parser.add_argument("--nprocs", default=2, type=int, help="workers to spawn")
parser.add_argument("--dist-url", default="tcp://127.0.0.1:23456", type=str)
parser.add_argument("--epochs", default=2, type=int)
parser.add_argument("--steps", default=10, type=int, help="steps per epoch")
parser.add_argument("-b", "--batch-size", default=8, type=int, help="per worker")
parser.add_argument("-p", "--print-freq", default=5, type=int)
parser.add_argument(
    "--start-method",
    default=None,
    help="start the workers with mp.start_processes and this method (facebookresearch/pycls "
    "forks them: start_method='fork'); mp.spawn when not given",
)


class AverageMeter:
    def __init__(self):
        self.val = self.sum = self.count = self.avg = 0

    def update(self, val, n=1):
        self.val, self.sum, self.count = val, self.sum + val * n, self.count + n
        self.avg = self.sum / self.count


def main():
    args = parser.parse_args()
    args.world_size = args.nprocs
    if args.start_method is None:
        mp.spawn(main_worker, nprocs=args.nprocs, args=(args.world_size, args))
    else:
        mp.start_processes(
            main_worker,
            args=(args.world_size, args),
            nprocs=args.nprocs,
            start_method=args.start_method,
        )


def main_worker(gpu, world_size, args):
    init_process_group(backend="gloo", init_method=args.dist_url, world_size=world_size, rank=gpu)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(args.steps * args.batch_size * world_size, 24, generator=gen)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Linear(24, 32), nn.Tanh(), nn.Linear(32, 3))
    )
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), 0.1, momentum=0.9)
    steps, last_loss, epoch_steps = 0, None, {}
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        losses = AverageMeter()
        epoch_steps[epoch] = 0
        for i, (inputs, target) in enumerate(loader):
            if os.environ.get("RW_FAULT") == "raise" and gpu == int(os.environ["RW_FAULT_RANK"]):
                if steps + 1 == int(os.environ["RW_FAULT_STEP"]):
                    raise RuntimeError(f"injected failure on worker {gpu} at step {steps + 1}")
            loss = criterion(model(inputs), target)
            losses.update(loss.item(), inputs.size(0))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            steps += 1
            epoch_steps[epoch] += 1
            last_loss = loss.item()
            if i % args.print_freq == 0:
                print(
                    f"[{gpu}] Epoch: [{epoch}][{i}/{len(loader)}] "
                    f"Loss {losses.val:.4f} ({losses.avg:.4f})",
                    flush=True,
                )
    report(dist.get_rank(), dist.get_world_size(), steps, last_loss, epoch_steps, pid=os.getpid())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
