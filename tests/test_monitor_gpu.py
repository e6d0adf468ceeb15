"""Real NVML on a real GPU (marked ``gpu``; skipped where NVML cannot start)."""

from __future__ import annotations

import os

import pytest

from ddptui.monitor import NA, GpuSource, RankInfo, SystemMonitor, join_ranks, normalize_uuid

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def real_nvml():
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        pytest.skip(f"no NVIDIA GPU: {exc}")
    try:
        if pynvml.nvmlDeviceGetCount() == 0:
            pytest.skip("NVML found no GPU")
        yield pynvml
    finally:
        pynvml.nvmlShutdown()


def in_range(value, low, high):
    return value is NA or low <= value <= high


def test_real_gpus_have_sane_values(real_nvml):
    with GpuSource() as source:
        report = source.sample()
        again = source.sample()
    assert report.available, report.reason
    assert report.driver_version is not NA and report.driver_version[0].isdigit()
    assert len(report.devices) == real_nvml.nvmlDeviceGetCount() == len(again.devices)
    uuids = set()
    for gpu in report.devices:
        assert isinstance(gpu.name, str) and gpu.name
        assert isinstance(gpu.uuid, str) and gpu.uuid.startswith("GPU-")
        uuids.add(normalize_uuid(gpu.uuid))
        assert isinstance(gpu.pci_bus_id, str) and ":" in gpu.pci_bus_id
        assert in_range(gpu.utilization_gpu, 0, 100)
        assert in_range(gpu.utilization_memory, 0, 100)
        assert gpu.memory_total is not NA and gpu.memory_total > 0
        assert gpu.memory_used is NA or 0 < gpu.memory_used <= gpu.memory_total
        assert in_range(gpu.temperature, 0, 120)
        assert in_range(gpu.power_draw, 0, 2000)
        assert in_range(gpu.power_limit, 1, 2000)
        assert in_range(gpu.sm_clock, 0, 5000)
        assert gpu.pcie_rx is NA and gpu.pcie_age is NA  # never read on the sampling path
        if gpu.processes is not NA:
            assert all(p.pid > 0 for p in gpu.processes)
    assert len(uuids) == len(report.devices)  # UUIDs are unique


def test_real_pcie_throughput_is_read_apart(real_nvml):
    with GpuSource() as source:
        report = source.sample()
        readings = source.sample_pcie()
    assert [r.index for r in readings] == [g.index for g in report.devices]
    assert [r.uuid for r in readings] == [g.uuid for g in report.devices]
    for reading in readings:
        assert in_range(reading.rx, 0, 1 << 40) and in_range(reading.tx, 0, 1 << 40)


def test_torch_rank_joins_its_gpu_by_uuid(real_nvml):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    from ddptui.rank.reporter import cuda_uuid

    device = torch.cuda.device_count() - 1  # not necessarily NVML's index of the same GPU
    block = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device=f"cuda:{device}")
    torch.cuda.synchronize(device)
    try:
        with SystemMonitor() as monitor:
            snap = monitor.sample(pids=[os.getpid()])
        uuid = cuda_uuid(device)
        view = join_ranks(snap, {0: RankInfo(pid=os.getpid(), device_uuid=uuid)})
        rank = view.rank(0)
        assert rank.gpu is not None, f"no NVML device has UUID {uuid}"
        assert normalize_uuid(rank.gpu.uuid) == normalize_uuid(uuid)
        # In a container without the host's pid namespace NVML lists host pids: only check
        # memory when NVML lists this process at all.
        if rank.gpu_memory is not NA:
            assert rank.gpu_memory >= 256 * 1024 * 1024
            assert view.gpu(rank.gpu.index).ranks == (0,)
    finally:
        del block
