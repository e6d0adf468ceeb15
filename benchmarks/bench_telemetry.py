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
from ddptui import protocol
from ddptui.constants import ENDPOINT_ENV, RUN_ID_ENV
from ddptui.rank import reporter
from ddptui.run.collector import Collector


def per_call_us(n: int = 50_000) -> float:
    ddptui.log(loss=1.0, samples=32)  # create the reporter outside the timing
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            ddptui.log(loss=0.5, samples=32)
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


def paced_call_us(n: int = 3_000, work_s: float = 0.0005) -> float:
    """Median cost of one call when calls are spaced like training steps (0.5 ms apart)."""
    ddptui.log(loss=1.0, samples=32)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        ddptui.log(loss=0.5, samples=32)
        t1 = time.perf_counter()
        times.append(t1 - t0)
        while time.perf_counter() - t1 < work_s:  # stand-in for a training step's compute
            pass
    return statistics.median(times) * 1e6


def with_env(endpoint: str | None, fn) -> tuple[float, tuple[int, int]]:
    """Run ``fn`` with a fresh reporter for ``endpoint``; its result and (sent, dropped)."""
    reporter.reset_reporter()
    if endpoint:
        os.environ[ENDPOINT_ENV] = endpoint
        os.environ[RUN_ID_ENV] = "bench"
    else:
        os.environ.pop(ENDPOINT_ENV, None)
    try:
        result = fn()
        r = reporter.get_reporter()
        return result, (r.sent, r.dropped)
    finally:
        reporter.reset_reporter()
        os.environ.pop(ENDPOINT_ENV, None)


def bench_log_call() -> None:
    print("== ddptui.log() cost per call (tight loops: best of 5 x 50k calls)")
    us, _ = with_env(None, per_call_us)
    print(f"no DDPTUI_ENDPOINT (no-op)     : {us:6.2f} us")
    with zmq.Context() as ctx, ctx.socket(zmq.PULL) as probe:
        port = probe.bind_to_random_port("tcp://127.0.0.1")
    us, (sent, dropped) = with_env(f"tcp://127.0.0.1:{port}", per_call_us)
    print(f"endpoint, nobody listening      : {us:6.2f} us  (sent {sent}, dropped {dropped})")
    endpoint, stop = start_collector_process()
    us, (sent, dropped) = with_env(endpoint, per_call_us)
    print(f"live collector, tight loop      : {us:6.2f} us  (sent {sent}, dropped {dropped})")
    us, (sent, dropped) = with_env(endpoint, paced_call_us)
    stop()
    print(f"live collector, paced (median)  : {us:6.2f} us  (one call per 0.5 ms, as in training)")


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
    print(
        f"== training step overhead ({blocks} interleaved blocks x {steps} steps, small CNN, "
        "batch 64, 1 thread)"
    )
    endpoint, stop = start_collector_process()
    model = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 10),
    )
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

    os.environ[ENDPOINT_ENV] = endpoint
    os.environ[RUN_ID_ENV] = "bench"
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

    def step(seq: int) -> protocol.Step:
        return protocol.Step(
            run="bench",
            rank=0,
            t=time.time(),
            seq=seq,
            step=seq,
            epoch=1,
            loss=0.5,
            samples=64,
            samples_per_s=1e4,
            step_time=0.0064,
            metrics={"lr": 0.1},
        )

    ctx_mp = mp.get_context("spawn")

    # Both sides drain a queue the pusher has already filled (unlimited receive HWM, and the
    # pusher has exited), so only receiving is timed, the same way for both.
    def raw(payload: bytes, count: int) -> float:
        with zmq.Context() as ctx, ctx.socket(zmq.PULL) as pull:
            pull.setsockopt(zmq.RCVHWM, 0)
            port = pull.bind_to_random_port("tcp://127.0.0.1")
            proc = ctx_mp.Process(target=_pusher, args=(f"tcp://127.0.0.1:{port}", count, payload))
            proc.start()
            proc.join(120)
            t0 = time.perf_counter()
            for _ in range(count):
                pull.recv()
            return count / (time.perf_counter() - t0)

    def collected(payload: bytes, count: int, per_message: int) -> float:
        c = Collector("bench", receive_hwm=0)
        proc = ctx_mp.Process(target=_pusher, args=(c.endpoint, count, payload))
        proc.start()
        proc.join(120)
        got = 0
        t0 = time.perf_counter()
        while got < count * per_message:
            got += len(c.poll(1.0))
        took = time.perf_counter() - t0
        c.close()
        return count / took

    def streamed(payload: bytes, count: int, collect: bool) -> float:
        """Receive ``count`` messages while another process is still sending them."""
        if collect:
            c = Collector("bench", max_batch=100)
            endpoint, receive = c.endpoint, lambda: len(c.poll(1.0))
        else:
            ctx = zmq.Context()
            pull = ctx.socket(zmq.PULL)
            endpoint = f"tcp://127.0.0.1:{pull.bind_to_random_port('tcp://127.0.0.1')}"

            def receive() -> int:
                pull.recv()
                return 1

        proc = ctx_mp.Process(target=_pusher, args=(endpoint, count, payload))
        proc.start()
        got = receive()  # the clock starts at the first message, as for raw receive
        t0 = time.perf_counter()
        first = got
        while got < count:
            got += receive()
        took = time.perf_counter() - t0
        proc.join(120)
        if collect:
            c.close()
        else:
            pull.close()
            ctx.term()
        return (got - first) / took

    single = protocol.encode_batch([step(1)])
    r = max(streamed(single, n, False) for _ in range(3))
    c = max(streamed(single, n, True) for _ in range(3))
    print("streamed: one event per message, received while the sender sends (best of 3):")
    print(f"  raw pyzmq recv                : {r:12,.0f} msg/s")
    print(f"  Collector.poll (recv+validate): {c:12,.0f} msg/s")
    print(f"  ratio                         : {c / r:12.2f}   (target >= 0.5)")
    r, c = max(raw(single, n) for _ in range(3)), max(collected(single, n, 1) for _ in range(3))
    print("pre-filled queue: receiving cost alone, no sender running (best of 3):")
    print(f"  raw pyzmq recv                : {r:12,.0f} msg/s ({1e6 / r:.2f} us/msg)")
    print(f"  Collector.poll (recv+validate): {c:12,.0f} msg/s ({1e6 / c:.2f} us/msg)")
    print(f"  ratio                         : {c / r:12.2f}")
    batch = protocol.encode_batch([step(i) for i in range(20)])
    m = n // 20
    c = max(collected(batch, m, 20) for _ in range(3))
    print(
        f"pre-filled, batches of 20 steps (as the reporter sends them): "
        f"{c * 20:,.0f} events/s validated"
    )


if __name__ == "__main__":
    what = sys.argv[1:] or ["log", "train", "ingest"]
    if "log" in what:
        bench_log_call()
    if "train" in what:
        bench_training_overhead()
    if "ingest" in what:
        bench_ingest()
