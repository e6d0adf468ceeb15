"""GPU sampling through NVML (``nvidia-ml-py``, imported as ``pynvml``).

:class:`GpuSource` initialises NVML lazily on the first :meth:`~GpuSource.sample`, queries
every device once per sample, and shuts NVML down on :meth:`~GpuSource.close` (or at
interpreter exit). It never raises for a missing GPU or an unsupported query:

* NVML cannot start (no library, no driver, no device): the :class:`GpuReport` says
  ``available=False`` with NVML's own message as ``reason``.
* One query fails (``NVMLError_NotSupported``, ``NoPermission``, ``GpuIsLost``, ...): that
  field is ``NA`` and every other field is still filled in.

The ``pynvml`` module is injectable (``GpuSource(nvml_module=fake)``) so tests and the
benchmark can run against a double with the same function surface.

Cost: :meth:`GpuSource.sample` reads only counters NVML answers at once (0.024 ms per GPU for
all of them, measured on an H100). PCIe throughput is not among them:
``nvmlDeviceGetPcieThroughput`` measures its byte counter over a 20 ms window per direction
(42 ms per GPU measured), so it has its own method, :meth:`GpuSource.sample_pcie`, which
:class:`ddptui.monitor.pcie.PcieSampler` calls on its own thread and cadence.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from types import ModuleType
from typing import Any

from ddptui.monitor.snapshot import (
    NA,
    GpuProcess,
    GpuReport,
    GpuSnapshot,
    NotAvailable,
    PcieReading,
)

__all__ = ["GpuSource"]


class GpuSource:
    """Samples every NVIDIA GPU on this machine into a :class:`GpuReport`.

    Thread-safe: :meth:`sample` and :meth:`close` may be called from different threads.
    After :meth:`close`, :meth:`sample` starts NVML again.

    >>> with GpuSource() as gpus:            # doctest: +SKIP
    ...     report = gpus.sample()
    ...     print(report.summary)            # "2 GPUs" or "no NVIDIA GPU: <NVML's reason>"
    """

    def __init__(self, nvml_module: ModuleType | Any | None = None) -> None:
        self._nvml_arg = nvml_module
        self._lock = threading.Lock()
        self._nvml: Any = None  # the module, once NVML is initialised
        self._failure: str | None = None  # why NVML could not start (sticky until close)
        self._driver_version: str | NotAvailable = NA
        self._handles: list[Any] = []
        self._static: list[tuple[Any, Any, Any]] = []  # (name, uuid, pci bus id) per device
        self._finalizer: weakref.finalize | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def _start(self) -> None:
        """Initialise NVML and enumerate devices; on failure remember why."""
        nvml = self._nvml_arg
        if nvml is None:
            try:
                import pynvml as nvml
            except ImportError as exc:  # the dependency is declared, but be defensive
                self._failure = f"nvidia-ml-py is not installed ({exc})"
                return
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            self._failure = _error_text(exc)
            return
        except OSError as exc:  # a broken libnvidia-ml.so that fails to load
            self._failure = f"NVML failed to load: {exc}"
            return
        # Shut NVML down at interpreter exit if nobody calls close() (the finalizer must not
        # reference self, or it would keep this object alive).
        self._finalizer = weakref.finalize(self, _shutdown, nvml)
        self._nvml = nvml
        try:
            count = nvml.nvmlDeviceGetCount()
            self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except nvml.NVMLError as exc:
            self._stop()
            self._failure = _error_text(exc)
            return
        if not self._handles:
            self._stop()
            self._failure = "NVML found no GPU"
            return
        self._driver_version = _text(_query(nvml, nvml.nvmlSystemGetDriverVersion))
        # Name, UUID and bus id never change while NVML is up: query them once.
        self._static = [
            (
                _text(_query(nvml, nvml.nvmlDeviceGetName, h)),
                _text(_query(nvml, nvml.nvmlDeviceGetUUID, h)),
                _bus_id(_query(nvml, nvml.nvmlDeviceGetPciInfo, h)),
            )
            for h in self._handles
        ]

    def _stop(self) -> None:
        if self._finalizer is not None:
            self._finalizer()  # runs _shutdown once and detaches from interpreter exit
            self._finalizer = None
        self._nvml = None
        self._handles = []
        self._static = []
        self._driver_version = NA

    def close(self) -> None:
        """Shut NVML down (if this source started it). Idempotent."""
        with self._lock:
            self._stop()
            self._failure = None

    def __enter__(self) -> GpuSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- sampling --------------------------------------------------------------------------

    def sample(self) -> GpuReport:
        """Query every GPU once (fast counters only: no PCIe). Never raises for NVML errors."""
        with self._lock:
            if self._nvml is None and self._failure is None:
                self._start()
            if self._failure is not None:
                return GpuReport.unavailable(self._failure)
            nvml = self._nvml
            devices = tuple(
                self._sample_device(nvml, index, handle)
                for index, handle in enumerate(self._handles)
            )
            return GpuReport(available=True, driver_version=self._driver_version, devices=devices)

    def sample_pcie(self) -> tuple[PcieReading, ...]:
        """PCIe throughput of every GPU: slow (about 2 x 20 ms per GPU), never raises.

        Holds the sampling lock only to look up the devices, not during the queries, so a
        :meth:`sample` on another thread never waits for them. Empty when NVML is not usable.
        """
        with self._lock:
            if self._nvml is None and self._failure is None:
                self._start()
            if self._failure is not None:
                return ()
            nvml, handles, static = self._nvml, list(self._handles), list(self._static)
        readings = []
        for index, handle in enumerate(handles):
            rx = _query(
                nvml, nvml.nvmlDeviceGetPcieThroughput, handle, nvml.NVML_PCIE_UTIL_RX_BYTES
            )
            tx = _query(
                nvml, nvml.nvmlDeviceGetPcieThroughput, handle, nvml.NVML_PCIE_UTIL_TX_BYTES
            )
            readings.append(
                PcieReading(
                    index=index,
                    uuid=static[index][1],
                    rx=NA if rx is NA else int(rx) * 1024,  # NVML reports KB/s
                    tx=NA if tx is NA else int(tx) * 1024,
                    monotonic=time.monotonic(),  # the end of the measuring window
                )
            )
        return tuple(readings)

    def _sample_device(self, nvml: Any, index: int, handle: Any) -> GpuSnapshot:
        name, uuid, bus_id = self._static[index]
        util = _query(nvml, nvml.nvmlDeviceGetUtilizationRates, handle)
        memory = _query(nvml, nvml.nvmlDeviceGetMemoryInfo, handle)
        power = _query(nvml, nvml.nvmlDeviceGetPowerUsage, handle)
        limit = _query(nvml, nvml.nvmlDeviceGetEnforcedPowerLimit, handle)
        procs = _query(nvml, nvml.nvmlDeviceGetComputeRunningProcesses, handle)
        return GpuSnapshot(
            index=index,
            name=name,
            uuid=uuid,
            pci_bus_id=bus_id,
            utilization_gpu=NA if util is NA else int(util.gpu),
            utilization_memory=NA if util is NA else int(util.memory),
            memory_used=NA if memory is NA else int(memory.used),
            memory_total=NA if memory is NA else int(memory.total),
            temperature=_query(
                nvml, nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU
            ),
            power_draw=NA if power is NA else power / 1000.0,  # NVML reports milliwatts
            power_limit=NA if limit is NA else limit / 1000.0,
            sm_clock=_query(nvml, nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM),
            pcie_rx=NA,  # filled in from a PcieReading where one was measured
            pcie_tx=NA,
            processes=NA if procs is NA else _processes(procs),
        )


def _query(nvml: Any, fn: Callable[..., Any], *args: Any) -> Any:
    """Call one NVML query; any NVML error (NotSupported above all) becomes NA."""
    try:
        return fn(*args)
    except nvml.NVMLError:
        return NA


def _processes(procs: list[Any]) -> tuple[GpuProcess, ...]:
    # usedGpuMemory is None where NVML cannot tell (pynvml maps NVML_VALUE_NOT_AVAILABLE).
    return tuple(
        GpuProcess(
            pid=int(p.pid),
            used_memory=NA if p.usedGpuMemory is None else int(p.usedGpuMemory),
        )
        for p in procs
    )


def _text(value: Any) -> str | NotAvailable:
    """Older pynvml versions return bytes for strings; newer ones return str."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return value


def _bus_id(info: Any) -> str | NotAvailable:
    if info is NA:
        return NA
    return _text(info.busId)


def _error_text(exc: BaseException) -> str:
    """NVML's message for an error (e.g. ``Driver Not Loaded``), never empty."""
    text = str(exc).strip()
    return text or type(exc).__name__


def _shutdown(nvml: Any) -> None:
    try:
        nvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - at shutdown there is nobody left to tell
        pass
