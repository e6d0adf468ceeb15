"""Zero-code instrumentation costs, printed as numbers (not a test).

Run: python benchmarks/bench_instrument.py [--rounds N] [--steps N]

1. Training step time with vs without the hooks (the built-in synthetic trainer's SmallCNN,
   batch 32, DDP over gloo with one rank, on CPU, one thread; a live collector receives the
   steps), interleaved blocks in one run, as a ratio of medians. Goal: overhead <= 1 %.
2. The cost per hook call: a step of a near-empty model with vs without the hooks (fastest
   blocks), divided by the hook calls the step makes (DDP forward pre/post on the DDP module
   and its inner module, one gradient hook once learned, ``backward``, optimizer pre/post);
   and the hooks' own Python bodies alone, called directly.
3. Why the forward hooks sit on DDP modules only: a torch *global* module hook (even a no-op)
   puts every submodule call on torch's slow path. The ratio of a 64-layer forward with one
   to without.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from ddptui.constants import ENDPOINT_ENV, RUN_ID_ENV  # noqa: E402
from ddptui.rank import instrument, reporter  # noqa: E402
from ddptui.rank.net import free_port  # noqa: E402
from ddptui.run.collector import Collector  # noqa: E402
from trainers.models import SmallCNN  # noqa: E402


def hooks(on: bool, model: DistributedDataParallel) -> None:
    """Switch the instrumentation on (installed, watching ``model``) or off (removed)."""
    instrument.uninstall()
    if on:
        instrument.install(force=True).watch(model)


def timed_steps(model, opt, x, y, steps: int) -> list[float]:
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    return times


def interleaved(model, opt, x, y, rounds: int, steps: int) -> tuple[float, float]:
    """Median step time without and with the hooks, alternating blocks (order swapped each
    round so drift hits both)."""
    plain: list[float] = []
    hooked: list[float] = []
    for r in range(rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        for on in order:
            hooks(on, model)
            timed_steps(model, opt, x, y, 3)  # settle (the hooks learn the last gradient)
            (hooked if on else plain).extend(timed_steps(model, opt, x, y, steps))
    hooks(False, model)
    return statistics.median(plain), statistics.median(hooked)


def per_hook_call(rounds: int) -> tuple[float, float]:
    """Microseconds per hook call and hook calls per step, on a near-empty model (the
    difference of the fastest blocks with and without the hooks)."""
    model = DistributedDataParallel(nn.Linear(2, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    x, y = torch.randn(4, 2), torch.randn(4, 1)

    def step() -> None:
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    def block(on: bool, n: int = 200) -> float:
        hooks(on, model)
        for _ in range(20):
            step()
        t0 = time.perf_counter()
        for _ in range(n):
            step()
        return (time.perf_counter() - t0) / n

    plain, hooked = [], []
    for _ in range(rounds):
        plain.append(block(False))
        hooked.append(block(True))
    inst = instrument.current()
    before = inst.hook_calls
    step()
    calls = inst.hook_calls - before
    hooks(False, model)
    # the fastest block of each kind: the least disturbed by anything else on the machine
    extra = min(hooked) - min(plain)
    return extra / calls * 1e6, calls


def hook_bodies(n: int = 5000, repeats: int = 5) -> float:
    """Microseconds per step of the hook functions themselves, called directly in step order
    (fastest of ``repeats``): instrumentation's own Python, without torch's dispatch."""
    model = DistributedDataParallel(nn.Linear(2, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    x, y = torch.randn(4, 2), torch.randn(4, 1)
    hooks(True, model)
    inst = instrument.current()
    for _ in range(10):
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    (watch,) = inst._watches.values()
    inner = model.module
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            inst._outer_pre(model, (x,), {})
            inst._inner_pre(inner, (x,), {})
            inst._inner_post(inner, (x,), y)
            inst._outer_post(model, (x,), y)
            inst._on_grad(watch, 0)
            inst._backward_call(loss)
            inst._backward_return()
            inst._opt_pre(opt, (), {})
            inst._opt_post(opt, (), {})
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    hooks(False, model)
    return best


def global_hook_ratio(rounds: int) -> float:
    net = nn.Sequential(*[nn.Linear(8, 8) for _ in range(64)])
    x = torch.randn(4, 8)

    def block(n: int = 300) -> float:
        t0 = time.perf_counter()
        with torch.no_grad():
            for _ in range(n):
                net(x)
        return (time.perf_counter() - t0) / n

    plain, hooked = [], []
    for _ in range(rounds):
        plain.append(block())
        handle = nn.modules.module.register_module_forward_pre_hook(lambda m, a: None)
        hooked.append(block())
        handle.remove()
    return min(hooked) / min(plain)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=20)
    opts = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    collector = Collector("bench")
    stop = threading.Event()

    def drain() -> None:
        while not stop.is_set():
            collector.poll(0.05)

    drainer = threading.Thread(target=drain, daemon=True)
    drainer.start()
    os.environ[ENDPOINT_ENV] = collector.endpoint
    os.environ[RUN_ID_ENV] = "bench"
    reporter.reset_reporter()
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    try:
        model = DistributedDataParallel(SmallCNN())
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x, y = torch.randn(32, 1, 16, 16), torch.randint(0, 10, (32,))
        plain, hooked = interleaved(model, opt, x, y, opts.rounds, opts.steps)
        print(
            f"step time (SmallCNN, batch 32, CPU, 1 thread): without hooks "
            f"{plain * 1e3:.3f} ms, with {hooked * 1e3:.3f} ms: ratio {hooked / plain:.4f} "
            f"(overhead {(hooked / plain - 1) * 100:+.2f} %, goal <= 1 %)"
        )
        per_call, calls = per_hook_call(opts.rounds * 2)
        print(
            f"cost per hook call (torch's dispatch included): {per_call:.2f} us ({calls} calls "
            f"per step: {per_call * calls:.1f} us per step)"
        )
        bodies = hook_bodies()
        print(
            f"the hooks' own bodies: {bodies / calls:.2f} us per call, {bodies:.1f} us per step "
            "(reporter.log of the step included)"
        )
        ratio = global_hook_ratio(opts.rounds)
        print(
            f"a global no-op module hook on a 64-layer forward: {ratio:.2f}x its time "
            "(why the hooks sit on DDP modules only)"
        )
        steps = collector.stats.received
        print(f"(the collector received {steps} events meanwhile)")
    finally:
        stop.set()
        drainer.join(timeout=2)
        instrument.uninstall()
        reporter.reset_reporter()
        dist.destroy_process_group()
        collector.close()


if __name__ == "__main__":
    main()
