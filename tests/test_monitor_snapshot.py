"""The NA sentinel, snapshot immutability, the JSON form, and unit formatting."""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle

import pytest

from ddptui.monitor import NA, GpuReport, GpuSnapshot, HostSnapshot, SystemSnapshot, is_na, to_dict
from ddptui.monitor.snapshot import NotAvailable
from ddptui.monitor.units import GiB, MiB, format_bytes, format_percent, format_rate, format_value


def gpu(**overrides) -> GpuSnapshot:
    values = dict(
        index=0,
        name="NVIDIA H100",
        uuid="GPU-abc",
        pci_bus_id="00000000:18:00.0",
        utilization_gpu=50,
        utilization_memory=20,
        memory_used=10 * GiB,
        memory_total=80 * GiB,
        temperature=40,
        power_draw=250.0,
        power_limit=700.0,
        sm_clock=1980,
        pcie_rx=1024,
        pcie_tx=2048,
        processes=(),
    )
    values.update(overrides)
    return GpuSnapshot(**values)


def host() -> HostSnapshot:
    return HostSnapshot(
        cpu_percent=NA,
        cpu_percent_per_core=(),
        cpu_count=2,
        load_average=NA,
        memory_total=8 * GiB,
        memory_used=GiB,
        memory_available=7 * GiB,
        memory_percent=12.5,
        swap_total=0,
        swap_used=0,
        swap_percent=0.0,
    )


def test_na_is_a_singleton_that_survives_copy_and_pickle():
    assert NotAvailable() is NA
    assert copy.copy(NA) is NA and copy.deepcopy(NA) is NA
    assert pickle.loads(pickle.dumps(NA)) is NA
    assert is_na(NA) and not is_na(0) and not is_na(None)


def test_na_renders_as_n_a_and_is_falsy():
    assert str(NA) == "N/A" and repr(NA) == "NA" and not NA


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("", "N/A"),
        (".1f", "N/A"),
        (">6.1f", "   N/A"),
        ("<5", "N/A  "),
        ("*^7", "**N/A**"),
        ("6d", "   N/A"),
        ("+08.2f", "     N/A"),
        ("=8", "     N/A"),
        ("<", "N/A"),
        (",", "N/A"),
    ],
)
def test_na_formats_with_any_numeric_spec(spec, expected):
    assert format(NA, spec) == expected


def test_snapshots_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        gpu().temperature = 99  # type: ignore[misc]


@pytest.mark.parametrize(
    ("used", "total", "percent", "free"),
    [
        (10 * GiB, 80 * GiB, 12.5, 70 * GiB),
        (NA, 80 * GiB, NA, NA),
        (GiB, NA, NA, NA),
        (0, 0, NA, 0),
    ],
)
def test_memory_derived_fields(used, total, percent, free):
    g = gpu(memory_used=used, memory_total=total)
    assert g.memory_percent == percent
    assert g.memory_free == free


def test_gpu_label_and_report_summary():
    assert gpu().label == "GPU 0 (NVIDIA H100)"
    assert gpu(name=NA, index=3).label == "GPU 3"
    assert GpuReport.unavailable("Driver Not Loaded").summary == "no NVIDIA GPU: Driver Not Loaded"
    assert GpuReport(True, devices=(gpu(), gpu(index=1))).summary == "2 GPUs"
    assert GpuReport(True, devices=(gpu(),)).summary == "1 GPU"


def test_to_dict_has_stable_keys_and_nulls_for_na():
    snap = SystemSnapshot(
        time=1.5,
        monotonic=2.0,
        gpu=GpuReport(True, driver_version="550", devices=(gpu(power_draw=NA, processes=NA),)),
        host=host(),
    )
    data = to_dict(snap)
    json.dumps(data)  # serialisable as is
    assert list(data) == ["v", "time", "gpu", "host", "processes"]
    assert data["gpu"]["devices"][0]["power_draw"] is None
    assert data["gpu"]["devices"][0]["processes"] is None
    assert data["host"]["cpu_percent"] is None and data["host"]["load_average"] is None
    unavailable = to_dict(dataclasses.replace(snap, gpu=GpuReport.unavailable("why")))
    assert unavailable["gpu"] == {
        "available": False,
        "reason": "why",
        "driver_version": None,
        "devices": [],
    }


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, "0 B"),
        (512, "512 B"),
        (1536, "1.5 KiB"),
        (10.2 * GiB, "10.2 GiB"),
        (300 * MiB, "300.0 MiB"),
        (NA, "N/A"),
    ],
)
def test_format_bytes(value, expected):
    assert format_bytes(value) == expected


def test_format_helpers():
    assert format_percent(97.4) == "97%" and format_percent(NA) == "N/A"
    assert format_percent(12.345, 1) == "12.3%"
    assert format_rate(2 * MiB) == "2.0 MiB/s" and format_rate(NA) == "N/A"
    assert format_value(61, "C") == "61C" and format_value(312.4, " W", 0) == "312 W"
    assert format_value(NA, "C") == "N/A"
