"""PCIe throughput, read on its own thread and cadence, off the sampling path.

NVML measures each PCIe direction over a ~20 ms window (42 ms per GPU measured on an H100,
against 0.024 ms per GPU for every other value the monitor shows). So a snapshot never waits
for it: a :class:`PcieSampler` reads every GPU's counters every ``interval`` seconds on a
daemon thread, and :func:`with_pcie` copies the latest reading into a snapshot together with
its age. A reading older than :attr:`PcieSampler.max_age` is dropped (the field is ``NA``), so
a value shown is always one that was measured, and how long ago is always known.

>>> pcie = PcieSampler(gpu_source, interval=5.0).start()      # doctest: +SKIP
>>> report = with_pcie(gpu_source.sample(), pcie.latest(), time.monotonic(), pcie.max_age)
>>> report.devices[0].pcie_rx, report.devices[0].pcie_age     # doctest: +SKIP
(1048576, 2.1)
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections.abc import Iterable

from ddptui.monitor.nvml import GpuSource
from ddptui.monitor.snapshot import NA, GpuReport, PcieReading

__all__ = [
    "DEFAULT_PCIE_INTERVAL",
    "MIN_PCIE_INTERVAL",
    "PcieSampler",
    "pcie_interval",
    "with_pcie",
]

log = logging.getLogger(__name__)

#: Seconds between two PCIe readings when PCIe is asked for without a cadence.
DEFAULT_PCIE_INTERVAL = 5.0
#: One reading of N GPUs takes about N x 42 ms; more often than this it would hog a core.
MIN_PCIE_INTERVAL = 1.0
#: A reading older than this many intervals is not shown (the thread is stuck or gone).
MAX_AGE_INTERVALS = 3


def pcie_interval(pcie: bool | float | None) -> float | None:
    """The PCIe cadence in seconds asked for by ``pcie``, or None for no PCIe at all.

    ``False``/``None``: never read PCIe. ``True``: every :data:`DEFAULT_PCIE_INTERVAL`
    seconds. A number: every that many seconds (at least :data:`MIN_PCIE_INTERVAL`); anything
    else raises ValueError saying what is allowed.
    """
    if pcie is None or pcie is False:
        return None
    if pcie is True:
        return DEFAULT_PCIE_INTERVAL
    try:
        value = float(pcie)
    except (TypeError, ValueError):
        raise ValueError(f"PCIe interval must be a number of seconds, got {pcie!r}") from None
    if not math.isfinite(value) or value < MIN_PCIE_INTERVAL:
        raise ValueError(f"PCIe interval must be at least {MIN_PCIE_INTERVAL:g} s, got {pcie!r}")
    return value


def with_pcie(
    report: GpuReport, readings: Iterable[PcieReading], now: float, max_age: float
) -> GpuReport:
    """``report`` with each GPU's PCIe fields taken from its reading (pure).

    A reading belongs to a GPU when index and UUID both match. GPUs without a reading, with
    one where NVML measured neither direction (not supported), or whose reading is older than
    ``max_age`` seconds at ``now`` (monotonic), keep ``NA`` (and no age).
    """
    by_index = {r.index: r for r in readings}
    if not report.available or not by_index:
        return report
    devices = []
    for gpu in report.devices:
        reading = by_index.get(gpu.index)
        age = None if reading is None else max(0.0, now - reading.monotonic)
        if (
            reading is None
            or reading.uuid != gpu.uuid
            or (reading.rx is NA and reading.tx is NA)
            or age is None
            or age > max_age
        ):
            devices.append(gpu)
            continue
        devices.append(
            dataclasses.replace(gpu, pcie_rx=reading.rx, pcie_tx=reading.tx, pcie_age=round(age, 3))
        )
    return dataclasses.replace(report, devices=tuple(devices))


class PcieSampler:
    """Reads PCIe throughput of every GPU of a :class:`GpuSource` every ``interval`` s.

    The first reading starts as soon as :meth:`start` is called. A slow reading delays the
    next one; it never causes a burst. :meth:`stop` joins the thread; :meth:`start` may be
    called again afterwards. The GpuSource stays open (its owner closes it, after stop()).
    """

    def __init__(
        self, gpus: GpuSource, interval: float = DEFAULT_PCIE_INTERVAL, name: str = "ddptui-pcie"
    ) -> None:
        value = pcie_interval(interval)
        assert value is not None
        self.interval = value
        #: Readings older than this (seconds) are not shown.
        self.max_age = MAX_AGE_INTERVALS * value
        self._gpus = gpus
        self._name = name
        self._latest: tuple[PcieReading, ...] = ()
        self._count = 0
        self._cond = threading.Condition()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> PcieSampler:
        """Start reading (a no-op while running). Returns self."""
        with self._cond:
            if self._thread is None or not self._thread.is_alive():
                self._stopping.clear()
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
        return self

    def stop(self, timeout: float | None = 5.0) -> None:
        """Stop and join the thread (waits for a reading in progress, at most ``timeout``)."""
        self._stopping.set()
        thread = self._thread
        if thread is not None and thread.is_alive() and thread is not threading.current_thread():
            thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def latest(self) -> tuple[PcieReading, ...]:
        """The newest reading of each GPU (empty before the first one)."""
        return self._latest

    @property
    def count(self) -> int:
        """How many readings of all GPUs have been taken."""
        return self._count

    def wait_for(self, count: int = 1, timeout: float | None = None) -> bool:
        """Block until ``count`` readings exist; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._count >= count, timeout)

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stopping.is_set():
            try:
                readings = self._gpus.sample_pcie()
            except Exception:  # a bug, not an NVML condition: keep the monitor alive
                log.exception("PCIe reading failed")
            else:
                with self._cond:
                    self._latest = readings
                    self._count += 1
                    self._cond.notify_all()
            next_at += self.interval
            now = time.monotonic()
            if next_at < now:  # the reading took longer than the interval
                next_at = now
            self._stopping.wait(next_at - now)
