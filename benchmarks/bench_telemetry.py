"""Telemetry costs, printed as numbers (not a test).

Run: uv run python benchmarks/bench_telemetry.py [log] [train] [ingest]

1. One ``ddptui.log`` call: no endpoint (plain torchrun), nobody listening, a live listener.
   Target <= 10 us.
2. Training step time with vs without ``ddptui.log`` (a small CNN on CPU), interleaved
   blocks in one run, as a ratio of medians. Target overhead <= 1 %.
3. Collector ingest (receive + validate) vs raw pyzmq receive of the same messages, in the
   same run, as a ratio. Target >= 0.5.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import sys
import time

import zmq

import ddptui
from ddptui import protocol, reporter
from ddptui.collector import Collector


def per_call_us(n: int = 50_000) -> float:
    ddptui.log(loss=1.0, samples=32)  # create the reporter outside the timing
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            ddptui.log(loss=0.5, samples=32)
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


def with_env(endpoint: str | None, fn) -> tuple[float, tuple[int, int]]:
    """Run ``fn`` with a fresh reporter for ``endpoint``; its result and (sent, dropped)."""
    reporter.reset_reporter()
    if endpoint:
        os.environ[reporter.ENDPOINT_ENV] = endpoint
        os.environ[reporter.RUN_ID_ENV] = "bench"
    else:
        os.environ.pop(reporter.ENDPOINT_ENV, None)
    try:
        result = fn()
        r = reporter.get_reporter()
        return result, (r.sent, r.dropped)
    finally:
        reporter.reset_reporter()
        os.environ.pop(reporter.ENDPOINT_ENV, None)


def bench_log_call() -> None:
    print("== ddptui.log() cost per call (best of 5 x 50k calls)")
    us, _ = with_env(None, per_call_us)
    print(f"no DDPTUI_ENDPOINT (no-op)     : {us:6.2f} us")
    with zmq.Context() as ctx, ctx.socket(zmq.PULL) as probe:
        port = probe.bind_to_random_port("tcp://127.0.0.1")
    us, (sent, dropped) = with_env(f"tcp://127.0.0.1:{port}", per_call_us)
    print(f"endpoint, nobody listening      : {us:6.2f} us  (sent {sent}, dropped {dropped})")
    endpoint, stop = start_collector_process()
    us, (sent, dropped) = with_env(endpoint, per_call_us)
    stop()
    print(f"live collector (own process)    : {us:6.2f} us  (sent {sent}, dropped {dropped})")


def start_collector_process():
    """A Collector draining in another process, as ddptui runs it; returns (endpoint, stop)."""
    ctx = mp.get_context("spawn")
    q, stop_ev = ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=_collector_proc, args=(q, stop_ev))
    proc.start()
    endpoint = q.get(timeout=60)

    def stop() -> None:
        stop_ev.set()
        proc.join(10)

    return endpoint, stop


def _collector_proc(endpoint_q, stop_ev):
    c = Collector("bench")
    endpoint_q.put(c.endpoint)
    while not stop_ev.is_set():
        c.poll(0.05)
    c.close()


def bench_training_overhead(blocks: int = 12, steps: int = 30) -> None:
    import torch
    from torch import nn

    torch.set_num_threads(1)
    print(f"== training step overhead ({blocks} interleaved blocks x {steps} steps, small CNN, "
          "batch 64, 1 thread)")
    endpoint, stop = start_collector_process()
    model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(32, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 1, 16, 16), torch.randint(0, 10, (64,))

    def block(report: bool) -> float:
        t0 = time.perf_counter()
        for _ in range(steps):
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            value = loss.item()
            if report:
                ddptui.log(epoch=1, loss=value, samples=64)
        return (time.perf_counter() - t0) / steps

    os.environ[reporter.ENDPOINT_ENV] = endpoint
    os.environ[reporter.RUN_ID_ENV] = "bench"
    reporter.reset_reporter()
    block(True)
    block(False)  # warm up
    plain, logged = [], []
    for i in range(blocks):
        order = (False, True) if i % 2 == 0 else (True, False)
        for report in order:
            (logged if report else plain).append(block(report))
    stop()
    r = reporter.get_reporter()
    sent = r.sent
    reporter.reset_reporter()
    p, lg = statistics.median(plain), statistics.median(logged)
    print(f"step time without telemetry     : {p * 1000:8.3f} ms (median of blocks)")
    print(f"step time with ddptui.log       : {lg * 1000:8.3f} ms  ({sent} events sent)")
    print(f"overhead ratio                  : {lg / p:8.4f}  ({(lg / p - 1) * 100:+.2f} %)")


def _pusher(endpoint: str, n: int, payload: bytes) -> None:
    with zmq.Context() as ctx, ctx.socket(zmq.PUSH) as push:
        push.setsockopt(zmq.SNDHWM, 0)
        push.connect(endpoint)
        for _ in range(n):
            push.send(payload)
        push.setsockopt(zmq.LINGER, -1)


def bench_ingest(n: int = 200_000) -> None:
    print(f"== collector ingest vs raw pyzmq receive ({n} messages from another process)")
    payload = protocol.encode(protocol.Step(run="bench", rank=0, t=time.time(), seq=1, step=1,
                                            epoch=1, loss=0.5, samples=64, samples_per_s=1e4,
                                            step_time=0.0064, metrics={"lr": 0.1}))
    ctx_mp = mp.get_context("spawn")

    def raw() -> float:
        with zmq.Context() as ctx, ctx.socket(zmq.PULL) as pull:
            port = pull.bind_to_random_port("tcp://127.0.0.1")
            proc = ctx_mp.Process(target=_pusher, args=(f"tcp://127.0.0.1:{port}", n, payload))
            proc.start()
            pull.recv()
            t0 = time.perf_counter()
            for _ in range(n - 1):
                pull.recv()
            took = time.perf_counter() - t0
            proc.join()
        return (n - 1) / took

    def collected() -> float:
        c = Collector("bench")
        proc = ctx_mp.Process(target=_pusher, args=(c.endpoint, n, payload))
        proc.start()
        got = 0
        while got == 0:
            got = len(c.poll(1.0))
        t0 = time.perf_counter()
        while got < n:
            got += len(c.poll(1.0))
        took = time.perf_counter() - t0
        proc.join()
        c.close()
        return n / took

    raws, cols = [], []
    for _ in range(3):
        raws.append(raw())
        cols.append(collected())
    r, c = max(raws), max(cols)
    print(f"raw pyzmq recv                  : {r:12,.0f} msg/s (best of 3)")
    print(f"Collector.poll (recv+validate)  : {c:12,.0f} msg/s (best of 3)")
    print(f"ratio                           : {c / r:12.2f}")


if __name__ == "__main__":
    what = sys.argv[1:] or ["log", "train", "ingest"]
    if "log" in what:
        bench_log_call()
    if "train" in what:
        bench_training_overhead()
    if "ingest" in what:
        bench_ingest()
