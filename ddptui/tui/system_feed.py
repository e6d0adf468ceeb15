"""The dashboard's side of the monitor layer: one background Sampler, its latest snapshot
joined to the run's ranks, and bounded history for sparklines.

Everything here runs on the UI thread except the Sampler's own thread; reading
``sampler.latest()`` is one attribute read, so the UI never waits on NVML or psutil.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from typing import Protocol

from ddptui.monitor import (
    History,
    RankGpuView,
    RankInfo,
    Sampler,
    SystemSnapshot,
    is_na,
    join_ranks,
    rank_labels_from_environment,
)

#: Host CPU and RAM samples kept for their sparklines (one column each).
HOST_HISTORY = 300


class SamplerLike(Protocol):
    """What the dashboard needs of :class:`ddptui.monitor.Sampler` (tests pass a fake)."""

    def start(self) -> object: ...
    def stop(self, timeout: float | None = ...) -> None: ...
    def latest(self) -> SystemSnapshot | None: ...
    def set_pids(self, pids) -> None: ...


def default_sampler(interval: float, pcie: bool | float = False) -> SamplerLike:
    """The monitor layer's Sampler. PCIe throughput (NVML: ~42 ms per GPU) is read only when
    asked for, on its own thread (``pcie``: True for every 5 s, or seconds)."""
    return Sampler(interval=interval, pcie=pcie)


class SystemFeed:
    """Latest system snapshot, its rank join, and history; refreshed by :meth:`tick`."""

    def __init__(self, make_sampler: Callable[[float], SamplerLike], interval: float = 1.0):
        self._make_sampler = make_sampler
        self.interval = interval
        self.sampler: SamplerLike | None = None
        self.snapshot: SystemSnapshot | None = None
        self.view: RankGpuView | None = None
        self.history = History.for_window(300, interval)
        #: Host CPU and RAM percent per sample (None where CPU had no answer yet).
        self.host_cpu: deque[float | None] = deque(maxlen=HOST_HISTORY)
        self.host_ram: deque[float | None] = deque(maxlen=HOST_HISTORY)
        self._ranks: dict[int, RankInfo] = {}
        self._extra_pids: tuple[int, ...] = ()
        #: pid -> "rank N · run ID" for GPU processes that are ranks of any run.
        self.env_labels: dict[int, str] = {}

    @property
    def has_ranks(self) -> bool:
        """True when a run's ranks are known (GPU processes are then labelled by rank)."""
        return bool(self._ranks)

    def start(self) -> None:
        if self.sampler is None:
            self.sampler = self._make_sampler(self.interval)
            self.sampler.start()

    def stop(self) -> None:
        if self.sampler is not None:
            self.sampler.stop()

    def set_ranks(self, ranks: Mapping[int, tuple[int | None, str | None]]) -> None:
        """Rank -> (pid, device uuid); the sampler tracks the ranks' process trees."""
        infos = {r: RankInfo(pid=pid, device_uuid=uuid) for r, (pid, uuid) in ranks.items()}
        if infos != self._ranks:
            self._ranks = infos
            self._push_pids()
            if self.snapshot is not None:
                self.view = join_ranks(self.snapshot, infos)

    def track_gpu_processes(self) -> None:
        """Also track every process NVML lists (the standalone monitor's process list)."""
        if self.snapshot is None:
            return
        pids = tuple(
            sorted(
                {p.pid for g in self.snapshot.gpus if not is_na(g.processes) for p in g.processes}
            )
        )
        if pids != self._extra_pids:
            self._extra_pids = pids
            self.env_labels = rank_labels_from_environment(pids)
            self._push_pids()

    def _push_pids(self) -> None:
        if self.sampler is not None:
            pids = {i.pid for i in self._ranks.values() if i.pid is not None}
            self.sampler.set_pids(sorted(pids | set(self._extra_pids)))

    def tick(self) -> bool:
        """Take up the sampler's newest snapshot; True when there was a new one."""
        if self.sampler is None:
            return False
        snapshot = self.sampler.latest()
        if snapshot is None or snapshot is self.snapshot:
            return False
        self.take(snapshot)
        return True

    def take(self, snapshot: SystemSnapshot) -> None:
        """Record one snapshot as the latest (tick() does this; tests prime history)."""
        self.snapshot = snapshot
        self.view = join_ranks(snapshot, self._ranks)
        self.history.record(snapshot, self.view)
        host = snapshot.host
        self.host_cpu.append(None if is_na(host.cpu_percent) else float(host.cpu_percent))
        self.host_ram.append(float(host.memory_percent))
