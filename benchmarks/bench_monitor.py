"""Cost of one monitor snapshot: host (psutil), per GPU (fake NVML, real NVML if present).

    uv run python benchmarks/bench_monitor.py [--samples N]

Prints medians (and p90) in milliseconds, measured in this run. Target: <= 5 ms per GPU.
Not a test: numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.fake_nvml

from ddptui.monitor import MIN_PCIE_INTERVAL, GpuSource, HostSource, SystemMonitor  # noqa: E402
from tests.fake_nvml import PCIE_QUERY_S, FakeGpu, FakeNvml, GiB  # noqa: E402

TARGET_MS_PER_GPU = 5.0


def measure(fn: Callable[[], object], samples: int) -> tuple[float, float]:
    """(median, p90) of one call, in ms, after a few warm-up calls."""
    for _ in range(min(5, samples)):
        fn()
    times = []
    for _ in range(samples):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    times.sort()
    return statistics.median(times), times[int(0.9 * (len(times) - 1))]


def row(
    label: str, result: tuple[float, float], per: int | None = None, target: bool = True
) -> None:
    median, p90 = result
    extra = ""
    if per:
        each = median / per
        verdict = "ok" if each <= TARGET_MS_PER_GPU else "OVER TARGET"
        extra = f"   {each:7.3f} ms/GPU"
        if target:
            extra += f" ({verdict}, target <= {TARGET_MS_PER_GPU} ms)"
        else:
            extra += " (off the sampling path: no target)"
    print(f"  {label:<44} median {median:8.3f} ms   p90 {p90:8.3f} ms{extra}")


def fake_gpus(n: int) -> list[FakeGpu]:
    return [
        FakeGpu(uuid=f"GPU-{i:08x}-0000-0000-0000-000000000000", processes={1000 + i: GiB})
        for i in range(n)
    ]


def bench_host(samples: int) -> None:
    print("host (psutil)")
    source = HostSource()
    row("CPU, load, RAM, swap", measure(source.sample, samples))
    me = [os.getpid()]
    row("  + this process", measure(lambda: source.sample(me), samples))
    # Four 'ranks', each with two children, like DataLoader workers.
    script = (
        "import subprocess, sys, time\n"
        "kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])"
        " for _ in range(2)]\n"
        "time.sleep(60)\n"
    )
    ranks = [subprocess.Popen([sys.executable, "-c", script]) for _ in range(4)]
    try:
        time.sleep(1.0)  # let the children start
        pids = [p.pid for p in ranks]
        row("  + 4 rank trees (12 processes)", measure(lambda: source.sample(pids), samples))
    finally:
        for p in ranks:
            for child in _children(p.pid):
                child.kill()
            p.kill()
            p.wait()


def _children(pid: int):
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def bench_fake(samples: int) -> None:
    print("GPU, fake NVML (the monitor's own overhead per GPU)")
    for n in (1, 8):
        source = GpuSource(FakeNvml(fake_gpus(n)))
        row(f"{n} GPU{'s' if n > 1 else ''}", measure(source.sample, samples), per=n)
        source.close()
    with SystemMonitor(FakeNvml(fake_gpus(8))) as monitor:
        row("whole snapshot: 8 fake GPUs + host", measure(monitor.sample, samples // 2 or 1))


class BusyPcie:
    """Reads PCIe throughput over and over on a thread of its own (while measuring)."""

    def __init__(self, source: GpuSource) -> None:
        self.source = source
        self.readings = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-pcie", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.source.sample_pcie()
            self.readings += 1

    def __enter__(self) -> BusyPcie:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def bench_pcie(source: GpuSource, n: int, samples: int) -> None:
    """Default snapshot, a PCIe reading alone, and the snapshot while PCIe is being read."""
    gpus = f"{n} GPU{'s' if n > 1 else ''}"
    row(f"{gpus}, default snapshot", measure(source.sample, samples), per=n)
    # PCIe counters block ~20 ms each inside NVML: fewer samples for that one.
    pcie = measure(source.sample_pcie, max(3, samples // 50))
    row(f"{gpus}, one PCIe reading (its own thread)", pcie, per=n, target=False)
    with BusyPcie(source) as busy:  # does NVML make the fast queries wait meanwhile?
        during = measure(source.sample, samples)
    row(f"{gpus}, default snapshot, PCIe being read", during, per=n)
    print(f"  ({busy.readings} PCIe readings of all GPUs happened during that measurement)")


def bench_fake_pcie(samples: int) -> None:
    print(
        f"PCIe off the sampling path: fake NVML whose PCIe calls sleep {PCIE_QUERY_S * 1000:.0f}"
        " ms per direction, like NVML's"
    )
    n = 8
    with GpuSource(FakeNvml(fake_gpus(n), pcie_sleep=PCIE_QUERY_S)) as source:
        bench_pcie(source, n, samples)
    nvml = FakeNvml(fake_gpus(n), pcie_sleep=PCIE_QUERY_S)
    with SystemMonitor(nvml, pcie=MIN_PCIE_INTERVAL) as monitor:
        monitor.wait_for_pcie(timeout=30)
        snap = monitor.sample()
    ages = [g.pcie_age for g in snap.gpus]
    print(
        "  SystemMonitor(pcie=1.0): PCIe calls on the sampling thread"
        f" {nvml.calls_on(threading.current_thread().name)['nvmlDeviceGetPcieThroughput']},"
        f" on its own thread {nvml.calls_on('ddptui-pcie')['nvmlDeviceGetPcieThroughput']};"
        f" reading ages in the snapshot {min(ages):.2f}-{max(ages):.2f} s"
    )


def bench_real(samples: int) -> None:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - any failure means "no real NVML here"
        print(f"GPU, real NVML: not available here ({exc})")
        return
    try:
        n = pynvml.nvmlDeviceGetCount()
        name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0)) if n else "-"
        print(f"GPU, real NVML: {n} x {name}, driver {pynvml.nvmlSystemGetDriverVersion()}")
        if not n:
            return
        with GpuSource() as source:
            bench_pcie(source, n, samples)
    finally:
        pynvml.nvmlShutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=500, help="samples per measurement")
    args = parser.parse_args()
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
        f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}, {args.samples} samples each"
    )
    bench_host(max(20, args.samples // 5))
    bench_fake(args.samples)
    bench_fake_pcie(args.samples)
    bench_real(args.samples)


if __name__ == "__main__":
    main()
