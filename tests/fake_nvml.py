"""A stand-in for the ``pynvml`` module, with canned GPUs and injectable failures.

Same function surface as ``pynvml`` for everything the monitor calls, same return shapes
(objects with ``.gpu``/``.memory``, ``.total``/``.used``/``.free``, ``.busId``, process
objects with ``.pid``/``.usedGpuMemory``), same units (mW, KB/s, bytes) and the *real*
``pynvml.NVMLError_*`` classes, so code that works against this works against NVML::

    nvml = FakeNvml([FakeGpu(uuid="GPU-aaaa", name="NVIDIA H100", processes={1234: 10 * GiB})])
    nvml = FakeNvml(init_error=pynvml.NVMLError_DriverNotLoaded)
    nvml = FakeNvml([FakeGpu(unsupported={"nvmlDeviceGetPowerUsage"})])

Every call is counted in ``calls`` (name -> count), and per thread in ``calls_on(name)``.

A fake clock says what a sample would cost on real hardware, without timing anything: each
call advances the calling thread's ``spent(thread)`` by its cost (:data:`PCIE_QUERY_S` for
each PCIe direction, as NVML measures it over a 20 ms window; :data:`FAST_QUERY_S` for any
other call). ``pcie_sleep`` makes the PCIe calls also really sleep that long, so code that
reads PCIe on its own thread can be watched doing so::

    nvml = FakeNvml(gpus, pcie_sleep=0.02)
    ...
    nvml.calls_on("MainThread")["nvmlDeviceGetPcieThroughput"], nvml.spent("MainThread")
"""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml

GiB = 1024**3
MiB = 1024**2

#: Fake-clock cost of one PCIe throughput query: NVML samples the counter over 20 ms.
PCIE_QUERY_S = 0.020
#: Fake-clock cost of any other query: generous (an H100 answered all of a GPU's fast
#: queries together in 0.024 ms).
FAST_QUERY_S = 0.000_05


@dataclass
class FakeGpu:
    """Canned values for one GPU, in NVML's own units."""

    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    bus_id: str = "00000000:18:00.0"
    util_gpu: int = 50
    util_memory: int = 20
    memory_total: int = 80 * GiB
    memory_used: int = 10 * GiB
    temperature: int = 45
    power_mw: int = 250_000
    power_limit_mw: int = 700_000
    sm_clock_mhz: int = 1980
    pcie_rx_kbs: int = 1000
    pcie_tx_kbs: int = 2000
    #: pid -> used GPU memory in bytes (None: NVML cannot tell, like WDDM).
    processes: dict[int, int | None] = field(default_factory=dict)
    #: Names of pynvml functions that raise NVMLError_NotSupported for this GPU.
    unsupported: set[str] = field(default_factory=set)
    #: Names of pynvml functions that raise another NVMLError (name -> error class).
    errors: dict[str, type[pynvml.NVMLError]] = field(default_factory=dict)


class FakeNvml:
    """Module-like object: pass it wherever a ``pynvml`` module is accepted."""

    # The real error classes and constants, so `except nvml.NVMLError_NotSupported` works.
    NVMLError = pynvml.NVMLError
    NVMLError_NotSupported = pynvml.NVMLError_NotSupported
    NVMLError_LibraryNotFound = pynvml.NVMLError_LibraryNotFound
    NVMLError_DriverNotLoaded = pynvml.NVMLError_DriverNotLoaded
    NVMLError_NoPermission = pynvml.NVMLError_NoPermission
    NVMLError_GpuIsLost = pynvml.NVMLError_GpuIsLost
    NVMLError_Uninitialized = pynvml.NVMLError_Uninitialized
    NVMLError_Unknown = pynvml.NVMLError_Unknown
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVML_CLOCK_SM = pynvml.NVML_CLOCK_SM
    NVML_CLOCK_MEM = pynvml.NVML_CLOCK_MEM
    NVML_PCIE_UTIL_TX_BYTES = pynvml.NVML_PCIE_UTIL_TX_BYTES
    NVML_PCIE_UTIL_RX_BYTES = pynvml.NVML_PCIE_UTIL_RX_BYTES

    def __init__(
        self,
        gpus: list[FakeGpu] | None = None,
        *,
        init_error: type[pynvml.NVMLError] | None = None,
        driver_version: str = "550.54.15",
        pcie_sleep: float = 0.0,
    ) -> None:
        self.gpus = list(gpus or [])
        self.init_error = init_error
        self.driver_version = driver_version
        self.pcie_sleep = pcie_sleep
        self.initialized = 0  # nvmlInit minus nvmlShutdown, like NVML's refcount
        self.calls: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._thread_calls: defaultdict[str, Counter[str]] = defaultdict(Counter)
        self._spent: Counter[str] = Counter()

    # -- helpers ---------------------------------------------------------------------------

    def calls_on(self, thread: str) -> Counter[str]:
        """Calls made on the thread named ``thread`` (name -> count); a copy."""
        with self._lock:
            return Counter(self._thread_calls[thread])

    def spent(self, thread: str) -> float:
        """Fake-clock seconds the calls on the thread named ``thread`` would have taken."""
        with self._lock:
            return self._spent[thread]

    def _count(self, name: str) -> None:
        thread = threading.current_thread().name
        cost = PCIE_QUERY_S if name == "nvmlDeviceGetPcieThroughput" else FAST_QUERY_S
        with self._lock:
            self.calls[name] += 1
            self._thread_calls[thread][name] += 1
            self._spent[thread] += cost

    def _enter(self, name: str, handle: Any = None) -> FakeGpu | None:
        self._count(name)
        if self.initialized <= 0:
            raise pynvml.NVMLError_Uninitialized(pynvml.NVML_ERROR_UNINITIALIZED)
        if handle is None:
            return None
        gpu = self.gpus[handle.index]
        if name in gpu.unsupported:
            raise pynvml.NVMLError_NotSupported(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if name in gpu.errors:
            err = gpu.errors[name]
            raise err(_code(err))
        return gpu

    # -- lifecycle -------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self._count("nvmlInit")
        if self.init_error is not None:
            raise self.init_error(_code(self.init_error))
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialized -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver_version

    # -- devices ---------------------------------------------------------------------------

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> SimpleNamespace:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError_InvalidArgument(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return SimpleNamespace(index=index)

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._enter("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._enter("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetPciInfo(self, handle: Any) -> SimpleNamespace:
        gpu = self._enter("nvmlDeviceGetPciInfo", handle)
        return SimpleNamespace(busId=gpu.bus_id, busIdLegacy=gpu.bus_id[4:])

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> SimpleNamespace:
        gpu = self._enter("nvmlDeviceGetUtilizationRates", handle)
        return SimpleNamespace(gpu=gpu.util_gpu, memory=gpu.util_memory)

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> SimpleNamespace:
        gpu = self._enter("nvmlDeviceGetMemoryInfo", handle)
        return SimpleNamespace(
            total=gpu.memory_total, used=gpu.memory_used, free=gpu.memory_total - gpu.memory_used
        )

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        gpu = self._enter("nvmlDeviceGetTemperature", handle)
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return gpu.temperature

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return self._enter("nvmlDeviceGetPowerUsage", handle).power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        return self._enter("nvmlDeviceGetEnforcedPowerLimit", handle).power_limit_mw

    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int:  # noqa: A002 (pynvml's name)
        gpu = self._enter("nvmlDeviceGetClockInfo", handle)
        assert type == pynvml.NVML_CLOCK_SM
        return gpu.sm_clock_mhz

    def nvmlDeviceGetPcieThroughput(self, device: Any, counter: int) -> int:
        gpu = self._enter("nvmlDeviceGetPcieThroughput", device)
        if self.pcie_sleep:
            time.sleep(self.pcie_sleep)  # NVML measures the counter over a time window
        if counter == pynvml.NVML_PCIE_UTIL_RX_BYTES:
            return gpu.pcie_rx_kbs
        if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES:
            return gpu.pcie_tx_kbs
        raise pynvml.NVMLError_InvalidArgument(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[SimpleNamespace]:
        gpu = self._enter("nvmlDeviceGetComputeRunningProcesses", handle)
        return [
            SimpleNamespace(
                pid=pid, usedGpuMemory=mem, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF
            )
            for pid, mem in gpu.processes.items()
        ]


def _code(error: type[pynvml.NVMLError]) -> int:
    """The NVML return code that maps to this error class."""
    for code, cls in pynvml.NVMLError._valClassMapping.items():
        if cls is error:
            return code
    raise ValueError(f"{error!r} is not an NVMLError subclass")
