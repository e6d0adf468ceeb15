"""Immutable snapshots of one monitor sample, and the ``NA`` sentinel.

Every snapshot is a frozen dataclass built in one pass by a source (:mod:`.nvml`,
:mod:`.host`) and never changed afterwards, so a UI thread can read the latest one while the
sampler thread builds the next. A field that the GPU, the driver or the OS does not provide
holds :data:`NA` (rendered ``N/A``), never ``None`` and never an exception.

Units: bytes for memory, bytes per second for PCIe throughput, percent for utilisation,
degrees Celsius, watts, MHz. Process CPU percent is relative to one core (like ``top``), so
a multi-threaded process can exceed 100.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any, Final

from ddptui.formatting import counted

__all__ = [
    "NA",
    "NotAvailable",
    "is_na",
    "GpuProcess",
    "GpuSnapshot",
    "GpuReport",
    "PcieReading",
    "HostSnapshot",
    "ProcessSnapshot",
    "SystemSnapshot",
    "SNAPSHOT_SCHEMA_VERSION",
    "to_dict",
]

#: Version of the dictionary / JSON form produced by :func:`to_dict`. 2: each device has
#: ``pcie_age``; ``pcie_rx``/``pcie_tx`` are null unless PCIe was asked for and measured.
SNAPSHOT_SCHEMA_VERSION: Final = 2


class NotAvailable:
    """Type of :data:`NA`: a value the hardware, driver or OS does not provide.

    There is exactly one instance. It is falsy, renders as ``N/A``, survives copy and
    pickle as the same object (so ``value is NA`` always works), and becomes ``null`` in JSON
    (see :func:`to_dict`).
    """

    _instance: NotAvailable | None = None
    __slots__ = ()

    def __new__(cls) -> NotAvailable:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NA"

    def __str__(self) -> str:
        return "N/A"

    def __format__(self, spec: str) -> str:
        # f"{value:>8.1f}" must not blow up when value is NA: keep fill, align and width.
        fill, align, width = _ALIGN_WIDTH.match(spec).groups(default="")  # type: ignore[union-attr]
        if width and align in ("", "="):  # numbers align right; '=' is numbers-only
            align = ">"
        return format("N/A", f"{fill}{align}{width}")

    def __bool__(self) -> bool:
        return False

    def __reduce__(self) -> str:
        return "NA"


_ALIGN_WIDTH = re.compile(r"(?:(.)?([<>=^]))?[+\- ]?z?#?0?(\d*)")

#: The "not available" sentinel.
NA: Final = NotAvailable()


def is_na(value: object) -> bool:
    """True when ``value`` is :data:`NA`."""
    return value is NA


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A compute process holding memory on one GPU (as NVML lists it)."""

    pid: int
    #: Bytes of GPU memory, or NA (e.g. Windows WDDM, or without permission).
    used_memory: int | NotAvailable


@dataclass(frozen=True, slots=True)
class GpuSnapshot:
    """One GPU at one sample. ``index`` is NVML's index (PCI bus order), not CUDA's."""

    index: int
    name: str | NotAvailable
    #: NVML form, ``GPU-xxxxxxxx-…``; join on :func:`ddptui.monitor.normalize_uuid` of it.
    uuid: str | NotAvailable
    pci_bus_id: str | NotAvailable
    utilization_gpu: int | NotAvailable  # percent of time a kernel was running
    utilization_memory: int | NotAvailable  # percent of time memory was read or written
    memory_used: int | NotAvailable  # bytes
    memory_total: int | NotAvailable  # bytes
    temperature: int | NotAvailable  # degrees C
    power_draw: float | NotAvailable  # watts
    power_limit: float | NotAvailable  # watts (enforced limit)
    sm_clock: int | NotAvailable  # MHz
    #: PCIe throughput in bytes/s, from the latest reading of the PCIe thread
    #: (:mod:`ddptui.monitor.pcie`); NA where PCIe was not measured.
    pcie_rx: int | NotAvailable
    pcie_tx: int | NotAvailable
    #: Compute processes with their memory; NA when the driver cannot list them.
    processes: tuple[GpuProcess, ...] | NotAvailable = ()
    #: Seconds between the PCIe reading and this snapshot; NA when PCIe was not measured.
    pcie_age: float | NotAvailable = NA

    @property
    def memory_free(self) -> int | NotAvailable:
        if self.memory_used is NA or self.memory_total is NA:
            return NA
        return self.memory_total - self.memory_used

    @property
    def memory_percent(self) -> float | NotAvailable:
        """Memory used as a percent of total (NA when either is unknown or total is 0)."""
        if self.memory_used is NA or self.memory_total is NA or not self.memory_total:
            return NA
        return 100.0 * self.memory_used / self.memory_total

    @property
    def label(self) -> str:
        """``GPU 0 (NVIDIA H100 80GB HBM3)``, for messages."""
        return f"GPU {self.index}" if self.name is NA else f"GPU {self.index} ({self.name})"


@dataclass(frozen=True, slots=True)
class PcieReading:
    """PCIe throughput of one GPU, measured off the sampling path (~20 ms per direction)."""

    index: int
    uuid: str | NotAvailable
    rx: int | NotAvailable  # bytes/s received by the GPU
    tx: int | NotAvailable  # bytes/s sent by the GPU
    #: ``time.monotonic()`` when the measurement ended.
    monotonic: float


@dataclass(frozen=True, slots=True)
class GpuReport:
    """Every GPU NVML sees, or why there are none.

    ``available`` is False when NVML could not be used at all (no library, no driver, no
    device); ``reason`` then holds NVML's own message, e.g. ``NVML Shared Library Not Found``.
    """

    available: bool
    reason: str | None = None
    driver_version: str | NotAvailable = NA
    devices: tuple[GpuSnapshot, ...] = ()

    @classmethod
    def unavailable(cls, reason: str) -> GpuReport:
        return cls(available=False, reason=reason)

    @property
    def summary(self) -> str:
        """One line for a status bar: ``2 GPUs`` or ``no NVIDIA GPU: <reason>``."""
        if not self.available:
            return f"no NVIDIA GPU: {self.reason}"
        return counted(len(self.devices), "GPU")


@dataclass(frozen=True, slots=True)
class HostSnapshot:
    """CPU and memory of the machine at one sample."""

    #: Busy percent over all cores since the previous sample (NA on a too-short window).
    cpu_percent: float | NotAvailable
    #: Per-core busy percent, same window; empty when not available.
    cpu_percent_per_core: tuple[float, ...]
    cpu_count: int
    #: 1, 5 and 15 minute load averages (NA where the OS has none).
    load_average: tuple[float, float, float] | NotAvailable
    memory_total: int  # bytes
    memory_used: int  # bytes (total - available: what is really in use)
    memory_available: int  # bytes
    memory_percent: float
    swap_total: int
    swap_used: int
    swap_percent: float


@dataclass(frozen=True, slots=True)
class ProcessSnapshot:
    """One tracked process (a rank, or a descendant of one) at one sample."""

    pid: int
    #: The tracked pid this process belongs to (its own pid for a tracked root).
    root: int
    ppid: int | NotAvailable
    name: str | NotAvailable
    #: psutil status string: running, sleeping, disk-sleep, zombie, ...
    status: str | NotAvailable
    #: Percent of one core since the previous sample; NA the first time a pid is seen.
    cpu_percent: float | NotAvailable
    rss: int | NotAvailable  # bytes
    num_threads: int | NotAvailable


@dataclass(frozen=True, slots=True)
class SystemSnapshot:
    """One monitor sample: GPUs, host, and the tracked processes, taken together."""

    #: Wall-clock time (seconds since the epoch), for display only.
    time: float
    #: ``time.monotonic()`` at the sample, for rates and intervals.
    monotonic: float
    gpu: GpuReport
    host: HostSnapshot
    processes: tuple[ProcessSnapshot, ...] = ()

    @property
    def gpus(self) -> tuple[GpuSnapshot, ...]:
        return self.gpu.devices

    def process(self, pid: int) -> ProcessSnapshot | None:
        for proc in self.processes:
            if proc.pid == pid:
                return proc
        return None


def to_dict(snapshot: SystemSnapshot) -> dict[str, Any]:
    """A JSON-ready dict with stable keys: ``NA`` becomes ``None``, tuples become lists.

    Top-level keys: ``v``, ``time``, ``gpu`` (``available``, ``reason``,
    ``driver_version``, ``devices``), ``host``, ``processes``. Every key is present in every
    sample; unknown values are ``null``. Non-finite floats become ``null`` too.
    """
    data = dataclasses.asdict(snapshot)
    del data["monotonic"]  # meaningless outside this process
    return {"v": SNAPSHOT_SCHEMA_VERSION, **_jsonable(data)}


def _jsonable(value: Any) -> Any:
    if value is NA:
        return None
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
