"""GpuSource against the fake NVML: values, units, N/A per field, init failures, lifecycle."""

from __future__ import annotations

import time

import pynvml
import pytest

from ddptui.monitor import NA, GpuProcess, GpuSource
from tests.fake_nvml import FakeGpu, FakeNvml, GiB

H100 = FakeGpu(
    name="NVIDIA H100 80GB HBM3",
    uuid="GPU-11111111-aaaa-bbbb-cccc-000000000000",
    bus_id="00000000:18:00.0",
    util_gpu=97,
    util_memory=40,
    memory_total=80 * GiB,
    memory_used=70 * GiB,
    temperature=61,
    power_mw=312_500,
    power_limit_mw=700_000,
    sm_clock_mhz=1980,
    pcie_rx_kbs=1000,
    pcie_tx_kbs=3000,
    processes={1234: 10 * GiB, 5678: 512 * 1024**2},
)
T4 = FakeGpu(
    name="Tesla T4",
    uuid="GPU-22222222-aaaa-bbbb-cccc-000000000000",
    bus_id="00000000:3B:00.0",
    util_gpu=0,
    util_memory=0,
    memory_total=16 * GiB,
    memory_used=0,
    temperature=30,
    power_mw=9_000,
    power_limit_mw=70_000,
    sm_clock_mhz=300,
    pcie_rx_kbs=0,
    pcie_tx_kbs=0,
    unsupported={"nvmlDeviceGetPcieThroughput"},
)


def sample(*gpus: FakeGpu, **kwargs):
    nvml = FakeNvml(list(gpus))
    with GpuSource(nvml, **kwargs) as source:
        return source.sample(), nvml


def test_samples_every_gpu_with_converted_units():
    report, _ = sample(H100, T4)
    assert report.available and report.reason is None
    assert report.driver_version == "550.54.15"
    g0, g1 = report.devices
    assert (g0.index, g0.name, g0.uuid, g0.pci_bus_id) == (
        0,
        "NVIDIA H100 80GB HBM3",
        H100.uuid,
        "00000000:18:00.0",
    )
    assert (g0.utilization_gpu, g0.utilization_memory) == (97, 40)
    assert (g0.memory_used, g0.memory_total) == (70 * GiB, 80 * GiB)
    assert g0.temperature == 61
    assert g0.power_draw == pytest.approx(312.5)  # mW -> W
    assert g0.power_limit == pytest.approx(700.0)
    assert g0.sm_clock == 1980
    # PCIe throughput is never read by sample() (see test_monitor_pcie.py).
    assert (g0.pcie_rx, g0.pcie_tx, g0.pcie_age) == (NA, NA, NA)
    assert g0.processes == (GpuProcess(1234, 10 * GiB), GpuProcess(5678, 512 * 1024**2))
    assert (g1.index, g1.name, g1.processes) == (1, "Tesla T4", ())


# Each NVML query that can be unsupported, and the snapshot fields that become NA with it.
NA_CASES = [
    ("nvmlDeviceGetName", ["name"]),
    ("nvmlDeviceGetUUID", ["uuid"]),
    ("nvmlDeviceGetPciInfo", ["pci_bus_id"]),
    ("nvmlDeviceGetUtilizationRates", ["utilization_gpu", "utilization_memory"]),
    ("nvmlDeviceGetMemoryInfo", ["memory_used", "memory_total", "memory_percent", "memory_free"]),
    ("nvmlDeviceGetTemperature", ["temperature"]),
    ("nvmlDeviceGetPowerUsage", ["power_draw"]),
    ("nvmlDeviceGetEnforcedPowerLimit", ["power_limit"]),
    ("nvmlDeviceGetClockInfo", ["sm_clock"]),
    ("nvmlDeviceGetComputeRunningProcesses", ["processes"]),
]
ALL_FIELDS = {f for _, fields in NA_CASES for f in fields}


@pytest.mark.parametrize(
    "error",
    [
        pynvml.NVMLError_NotSupported,
        pynvml.NVMLError_NoPermission,
        pynvml.NVMLError_GpuIsLost,
        pynvml.NVMLError_Unknown,
    ],
)
@pytest.mark.parametrize(("function", "fields"), NA_CASES, ids=[c[0] for c in NA_CASES])
def test_a_failing_query_makes_only_its_fields_na(function, fields, error):
    if error is pynvml.NVMLError_NotSupported:
        broken = FakeGpu(processes={1: GiB}, unsupported={function})
    else:
        broken = FakeGpu(processes={1: GiB}, errors={function: error})
    report, _ = sample(H100, broken)
    assert report.available
    g0, g1 = report.devices
    for name in ALL_FIELDS:
        assert getattr(g0, name) is not NA, name  # the healthy GPU is untouched
        assert (getattr(g1, name) is NA) == (name in fields), name


def test_everything_unsupported_still_gives_a_snapshot():
    report, _ = sample(FakeGpu(unsupported={f for f, _ in NA_CASES}))
    (g,) = report.devices
    assert g.index == 0
    assert all(getattr(g, name) is NA for name in ALL_FIELDS)
    assert g.label == "GPU 0"


def test_process_memory_that_nvml_cannot_tell_is_na():
    report, _ = sample(FakeGpu(processes={42: None}))
    assert report.devices[0].processes == (GpuProcess(42, NA),)


def test_bytes_strings_from_older_pynvml_are_decoded():
    report, _ = sample(FakeGpu(name=b"Tesla V100", uuid=b"GPU-abc", bus_id=b"0000:01:00.0"))
    g = report.devices[0]
    assert (g.name, g.uuid, g.pci_bus_id) == ("Tesla V100", "GPU-abc", "0000:01:00.0")


def test_sample_never_reads_pcie():
    report, nvml = sample(H100, T4)
    assert all(g.pcie_rx is NA and g.pcie_tx is NA and g.pcie_age is NA for g in report.devices)
    assert nvml.calls["nvmlDeviceGetPcieThroughput"] == 0


def test_sample_pcie_reads_both_directions_in_bytes():
    nvml = FakeNvml([H100, T4])
    with GpuSource(nvml) as source:
        before = time.monotonic()
        r0, r1 = source.sample_pcie()
    assert (r0.index, r0.uuid, r0.rx, r0.tx) == (0, H100.uuid, 1000 * 1024, 3000 * 1024)
    assert (r1.index, r1.uuid, r1.rx, r1.tx) == (1, T4.uuid, NA, NA)  # T4: not supported
    assert before <= r0.monotonic <= r1.monotonic
    assert nvml.calls["nvmlDeviceGetPcieThroughput"] == 4


def test_sample_pcie_without_nvml_is_empty():
    nvml = FakeNvml([H100], init_error=pynvml.NVMLError_DriverNotLoaded)
    assert GpuSource(nvml).sample_pcie() == ()


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (pynvml.NVMLError_LibraryNotFound, "NVML Shared Library Not Found"),
        (pynvml.NVMLError_DriverNotLoaded, "Driver Not Loaded"),
        (pynvml.NVMLError_NoPermission, "Insufficient Permissions"),
    ],
)
def test_init_failure_reports_no_gpu_with_nvml_reason(error, reason):
    nvml = FakeNvml([H100], init_error=error)
    source = GpuSource(nvml)
    report = source.sample()
    assert not report.available and report.devices == ()
    assert report.reason == reason
    assert report.summary == f"no NVIDIA GPU: {reason}"
    source.sample()
    assert nvml.calls["nvmlInit"] == 1  # the failure is remembered, not retried per sample
    source.close()
    assert nvml.calls["nvmlShutdown"] == 0


def test_no_devices_is_no_gpu_and_shuts_nvml_down():
    nvml = FakeNvml([])
    report = GpuSource(nvml).sample()
    assert not report.available and report.reason == "NVML found no GPU"
    assert nvml.initialized == 0


def test_count_failure_is_no_gpu():
    nvml = FakeNvml([H100])
    nvml.nvmlDeviceGetCount = lambda: (_ for _ in ()).throw(
        pynvml.NVMLError_Unknown(pynvml.NVML_ERROR_UNKNOWN)
    )
    report = GpuSource(nvml).sample()
    assert not report.available and report.reason == "Unknown Error"
    assert nvml.initialized == 0


def test_init_is_lazy_and_close_shuts_down_once():
    nvml = FakeNvml([H100])
    source = GpuSource(nvml)
    assert nvml.calls["nvmlInit"] == 0  # constructing does not touch NVML
    source.sample()
    source.sample()
    assert nvml.calls["nvmlInit"] == 1 and nvml.initialized == 1
    source.close()
    source.close()
    assert nvml.calls["nvmlShutdown"] == 1 and nvml.initialized == 0


def test_sample_after_close_starts_nvml_again():
    nvml = FakeNvml([H100])
    source = GpuSource(nvml)
    source.sample()
    source.close()
    assert source.sample().available
    assert nvml.initialized == 1
    source.close()


def test_garbage_collected_source_shuts_nvml_down():
    nvml = FakeNvml([H100])
    source = GpuSource(nvml)
    source.sample()
    del source
    import gc

    gc.collect()
    assert nvml.initialized == 0


def test_one_pass_per_sample_and_static_fields_queried_once():
    nvml = FakeNvml([H100, T4, H100])
    with GpuSource(nvml) as source:
        for _ in range(3):
            source.sample()
    for per_sample in (
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetTemperature",
        "nvmlDeviceGetComputeRunningProcesses",
    ):
        assert nvml.calls[per_sample] == 3 * 3, per_sample
    assert nvml.calls["nvmlDeviceGetPcieThroughput"] == 0  # never on the sampling path
    for static in (
        "nvmlDeviceGetName",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetPciInfo",
        "nvmlDeviceGetHandleByIndex",
    ):
        assert nvml.calls[static] == 3, static
    assert nvml.calls["nvmlDeviceGetCount"] == 1


def test_missing_pynvml_module_is_reported(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == "pynvml":
            raise ImportError("No module named 'pynvml'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    report = GpuSource().sample()
    assert not report.available and "nvidia-ml-py is not installed" in report.reason
