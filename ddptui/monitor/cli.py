"""``ddptui monitor``: print GPU, CPU and RAM samples until stopped (no UI, no textual).

``python -m ddptui.monitor.cli --json --count 3 --interval 0.2`` prints three JSON lines.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from datetime import datetime
from types import ModuleType
from typing import IO, Any

from ddptui.commands import command_main
from ddptui.monitor.pcie import pcie_interval
from ddptui.monitor.sampler import DEFAULT_INTERVAL, MIN_INTERVAL, validate_interval
from ddptui.monitor.snapshot import NA, GpuSnapshot, SystemSnapshot, to_dict
from ddptui.monitor.system import SystemMonitor
from ddptui.monitor.units import format_bytes, format_percent, format_rate, format_value

__all__ = ["run_monitor_headless", "format_table", "add_arguments", "run", "main"]

#: Longest wait for the first PCIe reading before the first sample is printed anyway.
PCIE_FIRST_WAIT_S = 5.0


def run_monitor_headless(
    interval: float = DEFAULT_INTERVAL,
    count: int | None = None,
    as_json: bool = False,
    out: IO[str] | None = None,
    nvml_module: ModuleType | Any | None = None,
    pcie: bool | float = False,
) -> int:
    """Sample every ``interval`` seconds and print a table (or one JSON object per line).

    Stops after ``count`` samples (never when None), or on Ctrl-C; returns the exit code
    (0). ``out`` defaults to ``sys.stdout`` (looked up at call time). Raises ValueError for
    an interval below the minimum, a count below 1, or a bad ``pcie``.

    No sample reads PCIe throughput (NVML takes ~42 ms per GPU for it). With ``pcie=True``
    (every 5 s) or ``pcie=<seconds>`` a thread of its own reads it: the table gets a PCIe
    column with each reading's age, and JSON devices their ``pcie_rx``/``pcie_tx``/
    ``pcie_age`` (null where not measured). The first sample waits for the first reading.
    """
    if out is None:
        out = sys.stdout
    interval = validate_interval(interval)
    if count is not None and count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    with_pcie = pcie_interval(pcie) is not None
    # Ctrl-C sets a flag that the waits below see: a KeyboardInterrupt raised between a lock's
    # acquire and its block would leave the lock held, and closing NVML would wait forever.
    stop = threading.Event()
    previous = _on_sigint(stop.set)
    try:
        with SystemMonitor(nvml_module, pcie=pcie) as monitor:
            if with_pcie:  # ~42 ms per GPU, while the CPU window below fills anyway
                monitor.wait_for_pcie(timeout=PCIE_FIRST_WAIT_S)
            if stop.wait(monitor.cpu_warmup_remaining()):  # the first CPU % must mean something
                return 0
            taken = 0
            next_at = time.monotonic()
            while True:
                snapshot = monitor.sample()
                taken += 1
                if as_json:
                    out.write(json.dumps(to_dict(snapshot), separators=(",", ":")) + "\n")
                else:  # blocks separated by a blank line
                    table = format_table(snapshot, pcie=with_pcie)
                    out.write(("\n" if taken > 1 else "") + table + "\n")
                out.flush()
                if count is not None and taken >= count:
                    return 0
                next_at += interval
                delay = next_at - time.monotonic()
                if delay <= 0:  # a slow sample: carry on from now rather than bursting to catch up
                    next_at = time.monotonic()
                if stop.wait(max(0.0, delay)):
                    return 0
    except KeyboardInterrupt:  # where no handler could be set (not the main thread)
        return 0
    except BrokenPipeError:
        # The reader went away (`ddptui monitor | head`): stop quietly, and keep Python from
        # complaining when it flushes stdout at exit.
        if out is sys.stdout:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    finally:
        if previous is not _NOT_SET:
            signal.signal(signal.SIGINT, previous or signal.SIG_DFL)


_NOT_SET = object()


def _on_sigint(handler: Any) -> Any:
    """Make Ctrl-C call ``handler()``; returns the handler it replaces, or ``_NOT_SET`` where
    none could be set (outside the main thread Ctrl-C stays a KeyboardInterrupt)."""
    if threading.current_thread() is not threading.main_thread():
        return _NOT_SET
    try:
        return signal.signal(signal.SIGINT, lambda signum, frame: handler())
    except (ValueError, OSError):
        return _NOT_SET


# -- table -----------------------------------------------------------------------------------

_GPU_HEADER = f"{'GPU':>3}  {'NAME':<22} {'UTIL':>4} {'MEM':>21} {'TEMP':>4} {'POWER':>11}"
#: Width of the PCIe column: ``1023.9 MiB/s / 1023.9 MiB/s 14.9s ago``.
_PCIE_WIDTH = 38


def format_table(snapshot: SystemSnapshot, pcie: bool = False) -> str:
    """An nvidia-smi/gpustat-like block: one line per GPU, then CPU, RAM and swap lines.

    ``pcie``: add a column with each GPU's PCIe rx / tx throughput and the reading's age
    (``N/A`` where it was not measured).
    """
    stamp = datetime.fromtimestamp(snapshot.time).strftime("%Y-%m-%d %H:%M:%S")
    report = snapshot.gpu
    lines = []
    if report.available:
        lines.append(f"{stamp}  driver {report.driver_version}")
        pcie_header = f"  {'PCIE RX / TX':<{_PCIE_WIDTH}}" if pcie else ""
        lines.append(f"{_GPU_HEADER}{pcie_header}  PROCESSES")
        lines.extend(_gpu_line(gpu, pcie) for gpu in report.devices)
    else:
        lines.append(stamp)
        lines.append(f"GPU  {report.summary}")
    host = snapshot.host
    cores = " ".join(f"{c:.0f}" for c in host.cpu_percent_per_core)
    load = "N/A" if host.load_average is NA else " ".join(f"{x:.2f}" for x in host.load_average)
    lines.append(
        f"CPU  {format_percent(host.cpu_percent, 1):>6} of {host.cpu_count} cores"
        f"  load {load}" + (f"  per core: {cores}" if cores else "")
    )
    lines.append(
        f"RAM  {format_bytes(host.memory_used)} / {format_bytes(host.memory_total)}"
        f" ({host.memory_percent:.1f}%)"
        f"  swap {format_bytes(host.swap_used)} / {format_bytes(host.swap_total)}"
    )
    return "\n".join(lines)


def _gpu_line(gpu: GpuSnapshot, pcie: bool = False) -> str:
    name = "N/A" if gpu.name is NA else str(gpu.name).removeprefix("NVIDIA ")
    mem = (
        f"{_gib(gpu.memory_used)} / {_gib(gpu.memory_total)} GiB"
        f" {format_percent(gpu.memory_percent):>4}"
    )
    power = f"{format_value(gpu.power_draw, precision=0)} / {format_value(gpu.power_limit, 'W', 0)}"
    if gpu.processes is NA:
        procs = "N/A"
    else:
        procs = " ".join(f"{p.pid}({format_bytes(p.used_memory)})" for p in gpu.processes) or "-"
    pcie_cell = f"  {pcie_text(gpu):<{_PCIE_WIDTH}}" if pcie else ""
    return (
        f"{gpu.index:>3}  {name[:22]:<22} {format_percent(gpu.utilization_gpu):>4}"
        f" {mem:>21} {format_value(gpu.temperature, 'C'):>4} {power:>11}{pcie_cell}  {procs}"
    )


def pcie_text(gpu: GpuSnapshot) -> str:
    """``1.0 MiB/s / 2.9 MiB/s 2.1s ago``, or ``N/A`` where PCIe was not measured."""
    if gpu.pcie_age is NA:
        return "N/A"
    return f"{format_rate(gpu.pcie_rx)} / {format_rate(gpu.pcie_tx)} {gpu.pcie_age:.1f}s ago"


def _gib(value: object) -> str:
    return "N/A" if value is NA else f"{value / 1024**3:.1f}"  # type: ignore[operator]


# -- entry point -----------------------------------------------------------------------------


#: What ``ddptui monitor --help`` says first.
DESCRIPTION = "GPU (NVML), CPU and RAM usage every INTERVAL seconds, in the dashboard or printed."
#: Longest interval between samples, and most samples, that ``--interval``/``--count`` take.
MAX_INTERVAL = 86_400.0
MAX_COUNT = 10**9


def interval_arg(text: str) -> float:
    """argparse type of ``--interval``: finite seconds from 0.1 to a day."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be a number of seconds, got {_shown(text)}"
        ) from None
    if not (math.isfinite(value) and MIN_INTERVAL <= value <= MAX_INTERVAL):
        raise argparse.ArgumentTypeError(
            f"must be at least {MIN_INTERVAL} s and at most {MAX_INTERVAL:g} s, got {_shown(text)}"
        )
    return value


def count_arg(text: str) -> int:
    """argparse type of ``--count``: a whole number of samples, at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {_shown(text)}") from None
    if not 1 <= value <= MAX_COUNT:
        raise argparse.ArgumentTypeError(
            f"must be at least 1 and at most {MAX_COUNT}, got {_shown(text)}"
        )
    return value


def _shown(text: str, limit: int = 40) -> str:
    shown = repr(text)
    return shown if len(shown) <= limit else shown[: limit - 2] + "…" + shown[-1]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The monitor's command line, for ``ddptui monitor`` and ``python -m ddptui.monitor.cli``."""
    parser.add_argument(
        "--no-ui", action="store_true", help="print to the console instead of the dashboard"
    )
    parser.add_argument(
        "--interval",
        "-i",
        type=interval_arg,
        default=DEFAULT_INTERVAL,
        help=f"seconds between samples (default {DEFAULT_INTERVAL}, minimum {MIN_INTERVAL})",
    )
    parser.add_argument(
        "--count", "-n", type=count_arg, default=None, help="stop after N samples (default: never)"
    )
    parser.add_argument(
        "--json", action="store_true", help="one JSON object per line instead of a table"
    )
    parser.add_argument(
        "--pcie",
        nargs="?",
        const=True,
        default=False,
        type=pcie_arg,
        metavar="SECONDS",
        help="also read PCIe throughput, on its own thread (every 5 s, or every SECONDS); "
        "NVML samples each reading over ~20 ms per direction per GPU, so it is off by default",
    )


def pcie_arg(text: str) -> float:
    """argparse type of ``--pcie SECONDS``."""
    try:
        value = pcie_interval(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value is None or value > MAX_INTERVAL:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_INTERVAL:g} s, got {_shown(text)}")
    return value


def run(args: argparse.Namespace) -> int:
    """Print samples to stdout (``--no-ui`` or ``--json``)."""
    return run_monitor_headless(
        interval=args.interval, count=args.count, as_json=args.json, pcie=args.pcie
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m ddptui.monitor.cli``: always on the console (this module never loads the
    dashboard); a bad argument is one ``ddptui: error:`` line and exit code 2."""
    return command_main("ddptui monitor", DESCRIPTION, add_arguments, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
