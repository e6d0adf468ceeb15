"""A first step many times slower than the rest, as under ``torch.compile`` (the first call
traces and compiles; later calls reuse the result): the model is wrapped in a module that, on
its first forward, spends ``--compile-seconds`` of CPU "compiling" (autotuning: timing
candidate matmul layouts over and over), and the input pipeline takes ``--data-seconds`` per
batch (an I/O-bound loader), so later steps are short and mostly idle. Written for ddptui's
tests; no ddptui import.

    torchrun --nproc-per-node 2 slow_first_step.py [--compile-seconds 2.5] [--data-seconds 0.1]
"""

import argparse
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from facts import report
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class CompiledOnFirstCall(nn.Module):
    """Runs ``module``; its first call first busies the CPU for ``seconds`` (the compile)."""

    def __init__(self, module: nn.Module, seconds: float):
        super().__init__()
        self.module = module
        self.seconds = seconds
        self.compiled = False

    def autotune(self) -> None:
        a = torch.randn(64, 64)
        deadline = time.monotonic() + self.seconds
        while time.monotonic() < deadline:
            for layout in (a, a.t().contiguous()):
                (layout @ layout).sum().item()

    def forward(self, x):
        if not self.compiled:
            self.autotune()
            self.compiled = True
        return self.module(x)


class SlowSource(Dataset):
    """Random inputs, a fixed wait per batch (reading from slow storage)."""

    def __init__(self, size: int, batch: int, wait: float):
        gen = torch.Generator().manual_seed(3)
        self.x = torch.randn(size, 16, generator=gen)
        self.y = self.x.mean(dim=1, keepdim=True)
        self.batch, self.wait = batch, wait
        self.calls = 0

    def __len__(self):
        return len(self.x)

    def __getitem__(self, index):
        if self.calls % self.batch == 0:
            time.sleep(self.wait)
        self.calls += 1
        return self.x[index], self.y[index]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--compile-seconds", type=float, default=2.5)
    parser.add_argument("--data-seconds", type=float, default=0.1)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8, help="steps per epoch")
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    dataset = SlowSource(args.steps * args.batch_size * world, args.batch_size, args.data_seconds)
    sampler = DistributedSampler(dataset, shuffle=False)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    model = nn.parallel.DistributedDataParallel(CompiledOnFirstCall(net, args.compile_seconds))
    optimizer = torch.optim.SGD(model.parameters(), 0.05)
    steps, last_loss, epoch_steps, times = 0, None, {}, []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        epoch_steps[epoch] = 0
        mark = time.monotonic()
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            now = time.monotonic()
            times.append(now - mark)  # the step and the wait for its batch, as a user times it
            mark = now
            steps += 1
            epoch_steps[epoch] += 1
            last_loss = loss.item()
    first, rest = times[0], statistics.median(times[1:])
    report(
        rank,
        world,
        steps,
        last_loss,
        epoch_steps,
        first_step_s=round(first, 4),
        median_step_s=round(rest, 4),
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
