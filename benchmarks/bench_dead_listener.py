"""What a dead listener costs a rank, printed as ratios measured in one run (not a test).

Run: python benchmarks/bench_dead_listener.py [--blocks N] [--steps N] [--runs N]

A rank whose ``DDPTUI_ENDPOINT`` is set but where nobody listens (ddptui died, or the
variable leaked into a plain run) must cost what an unset endpoint costs. Goals (issue 12):

1. Training loop: a small MLP on CPU (1 thread, ~1 ms a step) calling ``ddptui.log`` every step, in
   interleaved blocks: endpoint unset vs set with nobody listening (tcp and ipc) vs a live
   collector. Ratio of medians of the per-step time (goal: dead / unset <= 1.01), and the
   extra time spent inside ``ddptui.log`` as a share of a step, which shared or busy machines
   resolve better than the ratio.
2. Exit: a short script that logs every step of a ~1 ms busy loop, run as a subprocess:
   start-to-exit wall time, and the time from the end of its loop to its exit, endpoint
   unset vs dead (tcp and ipc) vs live. Goal: dead - unset <= 0.2 s.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time

import zmq

import ddptui
from ddptui.constants import ENDPOINT_ENV, RUN_ID_ENV
from ddptui.rank import reporter
from ddptui.run.collector import Collector

RUN_ID = "bench"


def dead_tcp_endpoint() -> str:
    """A loopback port that was free a moment ago and that nobody listens on."""
    with zmq.Context() as ctx, ctx.socket(zmq.PULL) as probe:
        port = probe.bind_to_random_port("tcp://127.0.0.1")
    return f"tcp://127.0.0.1:{port}"


def dead_ipc_endpoint(directory: str) -> str:
    """An ipc path in an existing directory where no socket was ever bound."""
    return f"ipc://{os.path.join(directory, 'nobody.sock')}"


def start_collector_process():
    """A Collector draining in another process, as ddptui runs it; returns (endpoint, stop)."""
    ctx = mp.get_context("spawn")
    q, stop_ev = ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=_collector_proc, args=(q, stop_ev), daemon=True)
    proc.start()
    endpoint = q.get(timeout=60)

    def stop() -> None:
        stop_ev.set()
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join(5)

    return endpoint, stop


def _collector_proc(endpoint_q, stop_ev) -> None:
    c = Collector(RUN_ID)
    endpoint_q.put(c.endpoint)
    while not stop_ev.is_set():
        c.poll(0.05)
    c.close()


# -- 1. the training loop ---------------------------------------------------------------------
def bench_loop(endpoints: dict[str, str | None], blocks: int, steps: int) -> dict[str, float]:
    import torch
    from torch import nn

    torch.set_num_threads(1)
    torch.manual_seed(0)
    # A step of about 1 ms: short steps make any per-call cost of the reporter visible.
    model = nn.Sequential(
        nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))

    # One long-lived reporter per setting, as in a real rank (a fresh one per block would
    # time its start-up instead). ddptui.log uses whichever is installed as this process's.
    reps = {
        name: reporter.Reporter(endpoint, RUN_ID, rank=0) for name, endpoint in endpoints.items()
    }

    def install(rep: reporter.Reporter) -> None:
        reporter._reporter, reporter._reporter_pid = rep, os.getpid()

    step_s: dict[str, list[float]] = {name: [] for name in reps}  # every step, every block
    log_s: dict[str, list[float]] = {name: [] for name in reps}  # every ddptui.log call
    block_s: dict[str, list[float]] = {name: [] for name in reps}  # mean step of each block

    def block(name: str, keep: bool = True) -> None:
        install(reps[name])
        steps_here, logs_here = [], []
        t0 = time.perf_counter()
        for _ in range(steps):
            t1 = time.perf_counter()
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            t2 = time.perf_counter()
            ddptui.log(epoch=1, loss=loss.detach(), samples=64)
            t3 = time.perf_counter()
            steps_here.append(t3 - t1)
            logs_here.append(t3 - t2)
        if keep:
            block_s[name].append((time.perf_counter() - t0) / steps)
            step_s[name] += steps_here
            log_s[name] += logs_here

    names = list(reps)
    for name in names:  # warm up: first calls, connections, allocator
        block(name, keep=False)
    for i in range(blocks):
        for name in names[i % len(names) :] + names[: i % len(names)]:  # rotate who goes first
            block(name)
    reporter._reporter, reporter._reporter_pid = None, None
    medians = {name: statistics.median(t) for name, t in step_s.items()}
    by_block = {name: statistics.median(t) for name, t in block_s.items()}
    for name, rep in reps.items():
        t0 = time.perf_counter()
        rep.close()
        closed = time.perf_counter() - t0
        print(
            f"  {name:<20}: step {medians[name] * 1000:6.3f} ms  "
            f"ratio {medians[name] / medians['unset']:.4f}  "
            f"(by block {by_block[name] / by_block['unset']:.4f})  "
            f"log() {statistics.median(log_s[name]) * 1e6:5.1f} us"
        )
        extra = statistics.median(log_s[name]) - statistics.median(log_s["unset"])
        print(
            f"  {'':<20}  log() cost over unset: {extra / medians['unset'] * 100:+.2f} % of a "
            f"step; sent {rep.sent}, dropped {rep.dropped}, close() took {closed * 1000:.0f} ms"
        )
    return medians


# -- 2. process exit --------------------------------------------------------------------------
CHILD = """
import sys, time
import ddptui
n, work = int(sys.argv[1]), float(sys.argv[2])
for i in range(n):
    t1 = time.perf_counter()
    ddptui.log(epoch=1 + i // 100, loss=1.0 / (i + 1), samples=32)
    while time.perf_counter() - t1 < work:
        pass
print(time.monotonic(), flush=True)
"""


def run_child(endpoint: str | None, steps: int, work_s: float) -> tuple[float, float]:
    """(start-to-exit seconds, loop-end-to-exit seconds) of one child process."""
    env = {k: v for k, v in os.environ.items() if k not in (ENDPOINT_ENV, RUN_ID_ENV)}
    # The child imports the ddptui this process imported (not whatever its cwd holds).
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(ddptui.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    if endpoint:
        env[ENDPOINT_ENV] = endpoint
        env[RUN_ID_ENV] = RUN_ID
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(steps), str(work_s)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tempfile.gettempdir(),
    )
    t1 = time.monotonic()
    if proc.returncode != 0:
        raise RuntimeError(f"child failed ({proc.returncode}): {proc.stderr[-500:]}")
    loop_end = float(proc.stdout.strip().splitlines()[-1])
    return t1 - t0, t1 - loop_end


def bench_exit(endpoints: dict[str, str | None], runs: int, steps: int, work_s: float) -> None:
    total: dict[str, list[float]] = {name: [] for name in endpoints}
    tail: dict[str, list[float]] = {name: [] for name in endpoints}
    names = list(endpoints)
    for i in range(runs):
        order = names[i % len(names) :] + names[: i % len(names)]
        for name in order:
            whole, after_loop = run_child(endpoints[name], steps, work_s)
            total[name].append(whole)
            tail[name].append(after_loop)
    base_total, base_tail = statistics.median(total["unset"]), statistics.median(tail["unset"])
    for name in names:
        t, a = statistics.median(total[name]), statistics.median(tail[name])
        print(
            f"  {name:<22}: start-to-exit {t:6.3f} s ({t - base_total:+.3f} s)   "
            f"loop-end-to-exit {a * 1000:6.0f} ms ({(a - base_tail) * 1000:+.0f} ms)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=40, help="loop blocks per setting")
    parser.add_argument("--steps", type=int, default=50, help="training steps per block")
    parser.add_argument("--runs", type=int, default=5, help="child processes per setting")
    parser.add_argument("--child-steps", type=int, default=300, help="steps each child logs")
    args = parser.parse_args()

    live, stop = start_collector_process()
    with tempfile.TemporaryDirectory(prefix="ddptui-bench-") as tmp:
        endpoints = {
            "unset": None,
            "dead listener (tcp)": dead_tcp_endpoint(),
            "dead listener (ipc)": dead_ipc_endpoint(tmp),
            "live collector": live,
        }
        try:
            print(
                f"== training loop: MLP 256-256-256-10, batch 64, 1 thread, {args.blocks} "
                f"interleaved blocks x {args.steps} steps per setting\n"
                "   (median of all steps; ratio to unset; the same for medians of block means; "
                "median ddptui.log call)"
            )
            bench_loop(endpoints, args.blocks, args.steps)
            print(
                f"== process exit: a script logging {args.child_steps} steps of ~1 ms, "
                f"median of {args.runs} runs per setting (difference to unset)"
            )
            bench_exit(endpoints, args.runs, args.child_steps, 0.001)
        finally:
            stop()


if __name__ == "__main__":
    main()
