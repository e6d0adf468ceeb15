"""What torch's Flight Recorder costs a training step: recording on vs off, interleaved.

Two 2-rank gloo DDP jobs run side by side for the whole measurement, one with the recorder on
(``TORCH_FR_BUFFER_SIZE=2000``, plus ddptui's progress read every heartbeat, 1 s, as a rank
does) and one with it off (0). They take turns: a block of steps on one, then a block on the other,
alternating, so both see the same machine (load drifts on a shared box). Each step is a DDP
forward/backward/optimizer step of about 10 ms on CPU plus a metrics all_reduce of the loss.

    uv run python benchmarks/bench_flight_recorder.py [--blocks 20] [--steps 30] [--width 576]

Prints the median step time of each and the ratio on/off (the goal: at most 1.01), then what
recording adds to one collective (a 1-rank group, alternating fresh processes).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, port, buffer, width, inbox, outbox):
    os.environ["TORCH_FR_BUFFER_SIZE"] = buffer
    sys.path.insert(0, str(ROOT))
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    if buffer != "0":  # what ddptui's heartbeat does in a recording rank
        from ddptui.rank import flight_recorder
        from ddptui.rank.heartbeat import BEAT_S

        def beats():
            while True:
                time.sleep(BEAT_S)
                flight_recorder.progress()

        threading.Thread(target=beats, daemon=True).start()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(
            torch.nn.Linear(width, width),
            torch.nn.ReLU(),
            torch.nn.Linear(width, width),
            torch.nn.ReLU(),
            torch.nn.Linear(width, 1),
        ),
        bucket_cap_mb=0.25,  # a few buckets, as in a real model
    )
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x, y = torch.randn(64, width), torch.randn(64, 1)
    while True:
        steps = inbox.get()
        if steps is None:
            break
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total = loss.detach().reshape(1)
            dist.all_reduce(total)
            times.append(time.perf_counter() - t0)
        outbox.put(times)
    dist.barrier()
    dist.destroy_process_group()


_ONE_COLLECTIVE = """
import statistics, time, torch, torch.distributed as dist
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
t = torch.ones(1)
for _ in range(500):
    dist.all_reduce(t)
times = []
for _ in range(30):
    t0 = time.perf_counter()
    for _ in range(200):
        dist.all_reduce(t)
    times.append((time.perf_counter() - t0) / 200)
print(statistics.median(times))
"""


def per_collective(rounds: int = 4) -> dict[str, float]:
    """Median seconds per 1-float all_reduce on a 1-rank gloo group, recording off and on
    (fresh processes, alternating): what recording adds to each collective, with less noise
    than a step on a shared machine."""
    import subprocess

    got: dict[str, list[float]] = {"0": [], "2000": []}
    for _ in range(rounds):
        for buffer in got:
            out = subprocess.run(
                [sys.executable, "-c", _ONE_COLLECTIVE],
                env={**os.environ, "TORCH_FR_BUFFER_SIZE": buffer},
                capture_output=True,
                text=True,
                timeout=300,
            )
            got[buffer].append(float(out.stdout.strip().splitlines()[-1]))
    return {k: statistics.median(v) for k, v in got.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=20, help="blocks per side")
    p.add_argument("--steps", type=int, default=30, help="steps per block")
    p.add_argument("--width", type=int, default=576, help="hidden width (sets the step time)")
    p.add_argument("--warmup", type=int, default=2, help="blocks per side not counted")
    args = p.parse_args(argv)
    ctx = mp.get_context("spawn")
    jobs = {}
    for name, buffer in (("on", "2000"), ("off", "0")):
        port = _free_port()
        ranks = []
        for rank in range(2):
            inbox, outbox = ctx.Queue(), ctx.Queue()
            proc = ctx.Process(
                target=worker, args=(rank, port, buffer, args.width, inbox, outbox), daemon=True
            )
            proc.start()
            ranks.append((proc, inbox, outbox))
        jobs[name] = ranks
    times: dict[str, list[float]] = {"on": [], "off": []}
    block_ratio = []
    try:
        for block in range(args.blocks + args.warmup):
            medians = {}
            order = ("on", "off") if block % 2 == 0 else ("off", "on")
            for name in order:
                for _, inbox, _ in jobs[name]:
                    inbox.put(args.steps)
                got = [outbox.get(timeout=600) for _, _, outbox in jobs[name]]
                step = [max(a, b) for a, b in zip(*got, strict=True)]  # a step ends on both
                medians[name] = statistics.median(step)
                if block >= args.warmup:
                    times[name] += step
            if block >= args.warmup:
                block_ratio.append(medians["on"] / medians["off"])
    finally:
        for ranks in jobs.values():
            for _, inbox, _ in ranks:
                inbox.put(None)
        for ranks in jobs.values():
            for proc, _, _ in ranks:
                proc.join(30)
                if proc.is_alive():
                    proc.kill()
    on, off = statistics.median(times["on"]), statistics.median(times["off"])
    spread = statistics.quantiles(block_ratio, n=4) if len(block_ratio) > 1 else [0, 0, 0]
    print(
        f"steps: {len(times['on'])} per side, {args.blocks} blocks of {args.steps}, "
        f"interleaved (width {args.width}, gloo, 2 ranks, 1 thread each)"
    )
    print(f"median step, recording off: {off * 1e3:.2f} ms")
    print(f"median step, recording on:  {on * 1e3:.2f} ms")
    print(
        f"ratio on/off: {on / off:.4f} (median of steps); per-block ratios: median "
        f"{statistics.median(block_ratio):.4f}, quartiles {spread[0]:.4f}..{spread[2]:.4f}"
    )
    one = per_collective()
    added = one["2000"] - one["0"]
    print(
        f"one all_reduce (1 float, 1 rank): off {one['0'] * 1e6:.1f} us, on "
        f"{one['2000'] * 1e6:.1f} us: recording adds {added * 1e6:.1f} us per collective"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
