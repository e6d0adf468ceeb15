"""Per-step cost of the stop vote (trainers.stopping.StopVote) on 2 CPU gloo ranks.

Times N training-like steps (a small matmul and an all_reduce of a gradient-sized tensor on the
default group) with and without ``StopVote.agreed()`` after each, best of 4 interleaved rounds
each, and prints the added microseconds per step.
``python benchmarks/stop_vote.py [steps]``; about 10 s.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ddptui.rank.net import free_port
from trainers.stopping import StopVote


def _worker(rank: int, world: int, port: int, steps: int, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    vote = StopVote()
    a = torch.randn(128, 128)
    grad = torch.randn(50_000)

    def step() -> None:
        (a @ a).sum()
        dist.all_reduce(grad)

    results = {}
    rounds = [("warmup", True)] + [("plain", False), ("vote", True)] * 4
    for name, with_vote in rounds:  # interleaved: a busy machine slows both alike
        dist.barrier()
        started = time.perf_counter()
        for _ in range(steps):
            step()
            if with_vote:
                vote.agreed()
        took = (time.perf_counter() - started) / steps
        results[name] = min(results.get(name, took), took)
    vote.close()
    if rank == 0:
        out.put(results)
    dist.destroy_process_group()


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    mp.start_processes(_worker, (2, free_port(), steps, queue), nprocs=2, start_method="spawn")
    r = queue.get()
    print({k: round(v * 1e6, 1) for k, v in r.items()})
    plain = r["plain"]
    print(
        f"step without vote {plain * 1e6:.1f} us, with vote {r['vote'] * 1e6:.1f} us: "
        f"+{(r['vote'] - plain) * 1e6:.1f} us per step ({r['vote'] / plain:.3f}x)"
    )


if __name__ == "__main__":
    main()
