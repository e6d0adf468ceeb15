"""GPU and system monitoring: NVML and psutil sampled into immutable snapshots.

A library that knows nothing of any UI (like nvitop's ``api``): the dashboard and the
headless ``ddptui monitor`` command both draw from it. Nothing here raises because a GPU,
driver or field is missing: a machine without NVIDIA GPUs gets a report that says why
(``snapshot.gpu.reason``), and an unsupported field holds :data:`NA` (rendered ``N/A``).

Sample once::

    from ddptui.monitor import SystemMonitor

    with SystemMonitor() as monitor:                 # NVML starts lazily, stops on exit
        snap = monitor.sample(pids=[rank0_pid])      # GPUs + host + those process trees
        print(snap.gpu.summary)                      # "2 GPUs" / "no NVIDIA GPU: <reason>"
        for gpu in snap.gpus:
            print(gpu.index, gpu.name, gpu.utilization_gpu, gpu.memory_used, gpu.memory_total)

Sample in the background and join ranks to their GPUs by UUID::

    from ddptui.monitor import History, RankInfo, Sampler, join_ranks

    history = History()                              # 300 samples per GPU and per rank
    sampler = Sampler(interval=1.0).start()          # daemon thread; latest() or callback=
    ranks = {0: RankInfo(pid=4242, device_uuid="GPU-8c7a...")}   # from Status events
    sampler.set_pids(info.pid for info in ranks.values())
    snap = sampler.wait_for(1)
    view = join_ranks(snap, ranks)
    view.rank(0).gpu.utilization_gpu, view.rank(0).gpu_memory, view.foreign
    history.record(snap, view)
    sampler.stop()

PCIe throughput costs ~42 ms per GPU (NVML measures it over a window), so no snapshot reads it;
ask for it and a thread of its own reads it, each snapshot carrying the latest reading's age::

    with SystemMonitor(pcie=5.0) as monitor:         # every 5 s (pcie=True: the default 5 s)
        monitor.wait_for_pcie(timeout=5)
        gpu = monitor.sample().gpus[0]
        gpu.pcie_rx, gpu.pcie_tx, gpu.pcie_age       # bytes/s, bytes/s, seconds (NA: unmeasured)

Before launching, warn about GPUs another job holds::

    with SystemMonitor() as monitor:
        for line in preflight(monitor.sample()):
            print("warning:", line)  # GPU 0 (NVIDIA H100): pid 1234 holds 10.2 GiB — another job?
"""

from ddptui.monitor.history import DEFAULT_HISTORY, GpuHistory, History, RankHistory
from ddptui.monitor.host import HostSource
from ddptui.monitor.nvml import GpuSource
from ddptui.monitor.pcie import (
    DEFAULT_PCIE_INTERVAL,
    MIN_PCIE_INTERVAL,
    PcieSampler,
    pcie_interval,
    with_pcie,
)
from ddptui.monitor.ranks import (
    GpuProcessView,
    GpuView,
    RankGpuView,
    RankInfo,
    RankUsage,
    join_ranks,
    normalize_uuid,
    preflight,
    rank_labels_from_environment,
)
from ddptui.monitor.sampler import DEFAULT_INTERVAL, MIN_INTERVAL, Sampler, validate_interval
from ddptui.monitor.snapshot import (
    NA,
    GpuProcess,
    GpuReport,
    GpuSnapshot,
    HostSnapshot,
    NotAvailable,
    PcieReading,
    ProcessSnapshot,
    SystemSnapshot,
    is_na,
    to_dict,
)
from ddptui.monitor.system import SystemMonitor

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
    "to_dict",
    "GpuSource",
    "PcieSampler",
    "DEFAULT_PCIE_INTERVAL",
    "MIN_PCIE_INTERVAL",
    "pcie_interval",
    "with_pcie",
    "HostSource",
    "SystemMonitor",
    "Sampler",
    "DEFAULT_INTERVAL",
    "MIN_INTERVAL",
    "validate_interval",
    "History",
    "GpuHistory",
    "RankHistory",
    "DEFAULT_HISTORY",
    "RankInfo",
    "RankUsage",
    "GpuView",
    "GpuProcessView",
    "RankGpuView",
    "join_ranks",
    "normalize_uuid",
    "preflight",
    "rank_labels_from_environment",
]
