"""Bounded per-GPU and per-rank series for sparklines.

Each series is a ``collections.deque`` with ``maxlen``: appending past it drops the oldest
point, so memory stays fixed however long the run. Values that were ``NA`` are stored as
``None`` (keep them: dropping them would shift the time axis).

Not thread-safe: record and read on one thread (the UI's, when it receives a snapshot).

>>> history = History.for_window(seconds=300, interval=1.0)   # doctest: +SKIP
>>> history.record(snapshot, join_ranks(snapshot, ranks))      # doctest: +SKIP
>>> list(history.gpus[0].utilization)[-60:]                    # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field, fields

from ddptui.monitor.ranks import RankGpuView
from ddptui.monitor.snapshot import NA, SystemSnapshot

__all__ = ["DEFAULT_HISTORY", "GpuHistory", "RankHistory", "History"]

#: Five minutes at the default one-second interval.
DEFAULT_HISTORY = 300

Series = deque[float | None]


def _series(maxlen: int) -> Series:
    return deque(maxlen=maxlen)


@dataclass(slots=True)
class GpuHistory:
    """Series for one GPU (keyed by NVML index in :class:`History`)."""

    maxlen: int
    time: Series = field(init=False)  # monotonic seconds
    utilization: Series = field(init=False)  # percent
    memory_used: Series = field(init=False)  # bytes
    memory_percent: Series = field(init=False)
    temperature: Series = field(init=False)  # degrees C
    power_draw: Series = field(init=False)  # watts

    def __post_init__(self) -> None:
        _init_series(self)


@dataclass(slots=True)
class RankHistory:
    """Series for one rank: its process tree and its GPU."""

    maxlen: int
    time: Series = field(init=False)
    cpu_percent: Series = field(init=False)
    rss: Series = field(init=False)  # bytes
    gpu_utilization: Series = field(init=False)  # percent of the rank's GPU
    gpu_memory: Series = field(init=False)  # bytes held by the rank on its GPU

    def __post_init__(self) -> None:
        _init_series(self)


def _init_series(obj: GpuHistory | RankHistory) -> None:
    for f in fields(obj):
        if f.name != "maxlen":
            setattr(obj, f.name, _series(obj.maxlen))


class History:
    """Ring buffers of recent samples, per GPU and per rank."""

    def __init__(self, maxlen: int = DEFAULT_HISTORY) -> None:
        if maxlen < 1:
            raise ValueError(f"history length must be at least 1 sample, got {maxlen}")
        self.maxlen = maxlen
        self.gpus: dict[int, GpuHistory] = {}
        self.ranks: dict[int, RankHistory] = {}

    @classmethod
    def for_window(cls, seconds: float = 300.0, interval: float = 1.0) -> History:
        """Enough samples to cover ``seconds`` at ``interval``."""
        return cls(max(1, math.ceil(seconds / interval)))

    def record(self, snapshot: SystemSnapshot, view: RankGpuView | None = None) -> None:
        """Append one snapshot (and, when given, its rank join)."""
        t = snapshot.monotonic
        for gpu in snapshot.gpus:
            h = self.gpus.get(gpu.index)
            if h is None:
                h = self.gpus[gpu.index] = GpuHistory(self.maxlen)
            h.time.append(t)
            h.utilization.append(_value(gpu.utilization_gpu))
            h.memory_used.append(_value(gpu.memory_used))
            h.memory_percent.append(_value(gpu.memory_percent))
            h.temperature.append(_value(gpu.temperature))
            h.power_draw.append(_value(gpu.power_draw))
        if view is None:
            return
        for rank in view.ranks:
            r = self.ranks.get(rank.rank)
            if r is None:
                r = self.ranks[rank.rank] = RankHistory(self.maxlen)
            r.time.append(t)
            r.cpu_percent.append(_value(rank.cpu_percent))
            r.rss.append(_value(rank.rss))
            r.gpu_utilization.append(_value(rank.gpu_utilization))
            r.gpu_memory.append(_value(rank.gpu_memory))

    def clear(self) -> None:
        self.gpus.clear()
        self.ranks.clear()


def _value(value: object) -> float | None:
    return None if value is NA else float(value)  # type: ignore[arg-type]
