"""PCIe throughput off the sampling path: the default snapshot never reads it, a thread of its
own does when asked, and a snapshot shows a reading only with its age.

Costs are measured with the fake NVML's own clock and call counters (per thread), never with
wall-clock assertions: the fake's PCIe calls really sleep 20 ms, like NVML's, so a reading
done on the wrong thread would show up there as 40 ms per GPU.
"""

from __future__ import annotations

import io
import json
import re
import threading

import pytest

from ddptui.monitor import (
    DEFAULT_PCIE_INTERVAL,
    NA,
    GpuReport,
    GpuSnapshot,
    PcieReading,
    Sampler,
    SystemMonitor,
    pcie_interval,
    with_pcie,
)
from ddptui.monitor.cli import run_monitor_headless
from tests.fake_nvml import PCIE_QUERY_S, FakeGpu, FakeNvml

PCIE = "nvmlDeviceGetPcieThroughput"
#: issue 14: every value shown by default costs at most this per GPU per snapshot.
BUDGET_PER_GPU_S = 0.005
N_GPUS = 8


def gpus(n: int = N_GPUS) -> list[FakeGpu]:
    return [
        FakeGpu(uuid=f"GPU-{i:08x}-0000-0000-0000-000000000000", pcie_rx_kbs=1000, pcie_tx_kbs=3000)
        for i in range(n)
    ]


def nvml_cost_per_gpu(nvml: FakeNvml, sample, samples: int = 3) -> float:
    """Fake-clock NVML seconds per GPU of one ``sample()`` on this thread, after a first
    sample has started NVML."""
    sample()
    me = threading.current_thread().name
    before = nvml.spent(me)
    for _ in range(samples):
        sample()
    return (nvml.spent(me) - before) / samples / len(nvml.gpus)


def test_default_snapshot_never_reads_pcie_and_stays_within_budget():
    nvml = FakeNvml(gpus(), pcie_sleep=PCIE_QUERY_S)
    with SystemMonitor(nvml) as monitor:
        cost = nvml_cost_per_gpu(nvml, monitor.sample)
        snap = monitor.sample()
        assert monitor.pcie is None  # no PCIe thread either
    assert nvml.calls[PCIE] == 0
    assert cost <= BUDGET_PER_GPU_S
    assert all(g.pcie_rx is NA and g.pcie_tx is NA and g.pcie_age is NA for g in snap.gpus)


def test_default_sampler_thread_never_reads_pcie():
    nvml = FakeNvml(gpus(2), pcie_sleep=PCIE_QUERY_S)
    with Sampler(interval=0.1, nvml_module=nvml) as sampler:
        assert sampler.wait_for(2, timeout=30) is not None
    assert nvml.calls_on("ddptui-monitor")["nvmlDeviceGetUtilizationRates"] >= 4
    assert nvml.calls[PCIE] == 0


def test_asked_for_pcie_is_read_on_its_own_thread_and_shown_with_its_age():
    nvml = FakeNvml(gpus(), pcie_sleep=PCIE_QUERY_S)
    with SystemMonitor(nvml, pcie=1.0) as monitor:
        assert monitor.wait_for_pcie(timeout=60)
        cost = nvml_cost_per_gpu(nvml, monitor.sample)
        snap = monitor.sample()
        max_age = monitor.pcie.max_age
    me = threading.current_thread().name
    assert nvml.calls_on(me)[PCIE] == 0  # the sampling thread never waits for PCIe
    assert nvml.calls_on("ddptui-pcie")[PCIE] >= 2 * N_GPUS  # the PCIe thread reads it
    assert cost <= BUDGET_PER_GPU_S
    for gpu in snap.gpus:
        assert (gpu.pcie_rx, gpu.pcie_tx) == (1000 * 1024, 3000 * 1024)
        assert 0.0 <= gpu.pcie_age <= max_age
    assert not any(t.name == "ddptui-pcie" for t in threading.enumerate())  # stopped
    assert nvml.initialized == 0


def test_a_sampler_that_owns_its_monitor_stops_the_pcie_thread():
    nvml = FakeNvml(gpus(1))
    sampler = Sampler(interval=0.1, nvml_module=nvml, pcie=True).start()
    try:
        assert sampler.wait_for(1, timeout=30) is not None
    finally:
        sampler.stop()
    assert not any(t.name == "ddptui-pcie" for t in threading.enumerate())
    assert nvml.initialized == 0


def _gpu(index: int, uuid: str) -> GpuSnapshot:
    return GpuSnapshot(index, "GPU", uuid, NA, 1, 1, 1, 2, 40, 1.0, 2.0, 1, NA, NA)


REPORT = GpuReport(True, None, "1", tuple(_gpu(i, f"GPU-{c}") for i, c in enumerate("abcde")))


def test_with_pcie_shows_only_measured_matching_fresh_readings():
    readings = [
        PcieReading(0, "GPU-a", 1024, 2048, monotonic=98.0),  # 2 s old: shown
        PcieReading(1, "GPU-x", 1, 1, monotonic=99.0),  # another GPU at this index: not shown
        PcieReading(2, "GPU-c", 5, 6, monotonic=80.0),  # 20 s old, older than max age
        PcieReading(3, "GPU-d", NA, NA, monotonic=99.0),  # not supported: nothing measured
        PcieReading(4, "GPU-e", NA, 7, monotonic=99.0),  # one direction measured
    ]
    g0, g1, g2, g3, g4 = with_pcie(REPORT, readings, now=100.0, max_age=15.0).devices
    assert (g0.pcie_rx, g0.pcie_tx, g0.pcie_age) == (1024, 2048, 2.0)
    assert (g1.pcie_rx, g1.pcie_tx, g1.pcie_age) == (NA, NA, NA)
    assert (g2.pcie_rx, g2.pcie_tx, g2.pcie_age) == (NA, NA, NA)
    assert (g3.pcie_rx, g3.pcie_tx, g3.pcie_age) == (NA, NA, NA)
    assert (g4.pcie_rx, g4.pcie_tx, g4.pcie_age) == (NA, 7, 1.0)
    # A reading that ended after the snapshot began is 0 s old, not negative.
    (late,) = with_pcie(REPORT, readings[:1], now=97.5, max_age=15.0).devices[:1]
    assert late.pcie_age == 0.0
    assert with_pcie(REPORT, [], now=100.0, max_age=15.0) is REPORT
    unavailable = GpuReport.unavailable("no driver")
    assert with_pcie(unavailable, readings, now=100.0, max_age=15.0) is unavailable


@pytest.mark.parametrize(
    ("pcie", "expected"),
    [(False, None), (None, None), (True, DEFAULT_PCIE_INTERVAL), (2, 2.0), ("3.5", 3.5)],
)
def test_pcie_interval(pcie, expected):
    assert pcie_interval(pcie) == expected


@pytest.mark.parametrize("pcie", [0, 0.5, -1, float("nan"), float("inf"), "fast", [1]])
def test_bad_pcie_interval_is_refused_before_anything_starts(pcie):
    with pytest.raises(ValueError, match="PCIe interval must be"):
        SystemMonitor(FakeNvml(), pcie=pcie)
    with pytest.raises(ValueError, match="PCIe interval must be"):
        run_monitor_headless(
            interval=0.1, count=1, out=io.StringIO(), nvml_module=FakeNvml(), pcie=pcie
        )


def test_monitor_command_reads_no_pcie_by_default():
    nvml = FakeNvml(gpus(2), pcie_sleep=PCIE_QUERY_S)
    out = io.StringIO()
    run_monitor_headless(interval=0.1, count=2, as_json=True, out=out, nvml_module=nvml)
    run_monitor_headless(interval=0.1, count=1, out=out, nvml_module=nvml)
    assert nvml.calls[PCIE] == 0
    first = json.loads(out.getvalue().splitlines()[0])
    for device in first["gpu"]["devices"]:
        assert device["pcie_rx"] is None and device["pcie_tx"] is None
        assert device["pcie_age"] is None
    assert "PCIE" not in out.getvalue()


def test_monitor_command_with_pcie_shows_measured_values_and_their_age():
    nvml = FakeNvml(gpus(2), pcie_sleep=PCIE_QUERY_S)
    out = io.StringIO()
    run_monitor_headless(interval=0.1, count=1, as_json=True, out=out, nvml_module=nvml, pcie=1.0)
    device = json.loads(out.getvalue())["gpu"]["devices"][0]
    assert (device["pcie_rx"], device["pcie_tx"]) == (1000 * 1024, 3000 * 1024)
    assert 0.0 <= device["pcie_age"] <= 3.0
    out = io.StringIO()
    run_monitor_headless(interval=0.1, count=1, out=out, nvml_module=nvml, pcie=1.0)
    lines = out.getvalue().splitlines()
    assert "PCIE RX / TX" in lines[1]
    assert re.search(r"1000\.0 KiB/s / 2\.9 MiB/s \d+\.\ds ago", lines[2]), lines[2]
    assert nvml.calls_on(threading.current_thread().name)[PCIE] == 0
