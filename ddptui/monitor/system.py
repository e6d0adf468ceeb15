"""One object that takes a whole :class:`SystemSnapshot`: GPUs, host, tracked processes."""

from __future__ import annotations

import time
from collections.abc import Iterable
from types import ModuleType
from typing import Any

from ddptui.monitor.host import HostSource
from ddptui.monitor.nvml import GpuSource
from ddptui.monitor.snapshot import SystemSnapshot

__all__ = ["SystemMonitor"]


class SystemMonitor:
    """Combines a :class:`GpuSource` and a :class:`HostSource`.

    ``sample(pids)`` is one pass over everything; it never raises for a missing GPU or a
    vanished process. ``close()`` (or leaving the ``with`` block) shuts NVML down.

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
        pcie: bool = True,
    ) -> None:
        self.gpu = gpu if gpu is not None else GpuSource(nvml_module, pcie=pcie)
        self.host = host if host is not None else HostSource()

    def sample(self, pids: Iterable[int] = ()) -> SystemSnapshot:
        """Take one snapshot; ``pids`` are the roots of the process trees to report."""
        wall, mono = time.time(), time.monotonic()
        gpu = self.gpu.sample()
        host, processes = self.host.sample(pids)
        return SystemSnapshot(time=wall, monotonic=mono, gpu=gpu, host=host, processes=processes)

    def cpu_warmup_remaining(self) -> float:
        """Seconds to wait before the first sample so its CPU percentages mean something."""
        return self.host.cpu_warmup_remaining()

    def close(self) -> None:
        self.gpu.close()

    def __enter__(self) -> SystemMonitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
