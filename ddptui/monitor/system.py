"""One object that takes a whole :class:`SystemSnapshot`: GPUs, host, tracked processes."""

from __future__ import annotations

import time
from collections.abc import Iterable
from types import ModuleType
from typing import Any

from ddptui.monitor.host import HostSource
from ddptui.monitor.nvml import GpuSource
from ddptui.monitor.pcie import PcieSampler, pcie_interval, with_pcie
from ddptui.monitor.snapshot import SystemSnapshot

__all__ = ["SystemMonitor"]


class SystemMonitor:
    """Combines a :class:`GpuSource` and a :class:`HostSource`.

    ``sample(pids)`` is one pass over everything; it never raises for a missing GPU or a
    vanished process, and it never reads PCIe throughput itself (42 ms per GPU). With
    ``pcie=True`` (every 5 s) or ``pcie=<seconds>``, a :class:`PcieSampler` thread reads it
    from the first sample on, and each snapshot carries the latest reading and its age
    (``pcie_rx``, ``pcie_tx``, ``pcie_age``; NA until measured). ``close()`` (or leaving the
    ``with`` block) stops that thread and shuts NVML down.

    >>> with SystemMonitor() as monitor:          # doctest: +SKIP
    ...     snap = monitor.sample(pids=[rank0_pid, rank1_pid])
    ...     snap.gpu.summary, snap.host.cpu_percent, len(snap.processes)
    """

    def __init__(
        self,
        nvml_module: ModuleType | Any | None = None,
        *,
        gpu: GpuSource | None = None,
        host: HostSource | None = None,
        pcie: bool | float = False,
    ) -> None:
        self.gpu = gpu if gpu is not None else GpuSource(nvml_module)
        self.host = host if host is not None else HostSource()
        interval = pcie_interval(pcie)
        #: The PCIe thread, or None when PCIe throughput is not read at all.
        self.pcie = PcieSampler(self.gpu, interval) if interval is not None else None

    def sample(self, pids: Iterable[int] = ()) -> SystemSnapshot:
        """Take one snapshot; ``pids`` are the roots of the process trees to report."""
        wall, mono = time.time(), time.monotonic()
        gpu = self.gpu.sample()
        if self.pcie is not None:
            self.pcie.start()  # from the first sample on; a no-op while running
            gpu = with_pcie(gpu, self.pcie.latest(), mono, self.pcie.max_age)
        host, processes = self.host.sample(pids)
        return SystemSnapshot(time=wall, monotonic=mono, gpu=gpu, host=host, processes=processes)

    def wait_for_pcie(self, timeout: float | None = None) -> bool:
        """Start the PCIe thread and wait for its first reading (False: none in time, or
        PCIe was not asked for)."""
        if self.pcie is None:
            return False
        return self.pcie.start().wait_for(1, timeout)

    def cpu_warmup_remaining(self) -> float:
        """Seconds to wait before the first sample so its CPU percentages mean something."""
        return self.host.cpu_warmup_remaining()

    def close(self) -> None:
        if self.pcie is not None:
            self.pcie.stop()
        self.gpu.close()

    def __enter__(self) -> SystemMonitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
