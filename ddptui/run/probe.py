"""What ddptui measures itself for the diagnosis: each rank's CPU, I/O and resident memory,
the host's memory use, and the cgroup's memory use, limit and OOM kills.

Cheap enough to run once a second beside a run (a few ``psutil`` calls and small files under
``/sys/fs/cgroup``); every reading that fails is simply missing, never an error.
"""

from __future__ import annotations

from collections import deque
from pathlib import Path

import psutil

from ddptui.rank.heartbeat import io_sum
from ddptui.run.diagnosis import MemoryState, counter_rate

#: Seconds of CPU samples averaged per rank, and of host memory samples kept.
WINDOW_S = 20.0


class RankProbe:
    """Per-rank CPU percent (100 = one core), I/O rate and RSS, and host memory, sampled by
    the caller."""

    def __init__(self, cgroup_root: str | Path = "/sys/fs/cgroup") -> None:
        self._procs: dict[int, psutil.Process] = {}
        #: Rank -> a pid that no process here has: a rank on another node of a multi-node
        #: run (its pid means nothing on this machine) or one that is gone. Not looked up
        #: again every second (256 ranks on 32 nodes: 248 failed lookups a second).
        self._absent: dict[int, int] = {}
        self._cpu: dict[int, deque[tuple[float, float]]] = {}
        #: Per rank, ``(time, bytes moved so far)``: its I/O, counted as its heartbeat counts
        #: it (``/proc/<pid>/io``: files, pipes, TLS, storage; see ``heartbeat.io_sum``).
        self._io: dict[int, deque[tuple[float, int]]] = {}
        #: Each rank's last resident memory, in bytes.
        self.rss: dict[int, int] = {}
        self._host: deque[tuple[float, float]] = deque()
        self.cgroup_root = Path(cgroup_root)
        self.oom_kills_at_start = read_cgroup_memory(self.cgroup_root)[2]

    def sample(self, pids_by_rank: dict[int, int], now: float) -> None:
        for rank, pid in pids_by_rank.items():
            proc = self._procs.get(rank)
            if proc is None or proc.pid != pid:
                if self._absent.get(rank) == pid:
                    continue
                try:
                    proc = psutil.Process(pid)
                    proc.cpu_percent(None)  # the first call only starts the measurement
                except psutil.NoSuchProcess:
                    self._absent[rank] = pid
                    continue
                except (psutil.Error, OSError, ValueError):
                    continue
                self._procs[rank] = proc
                # Another process under this rank (a worker the script started, now the
                # rank): the samples of the one before (a spawner idling while its workers
                # start) are not this one's CPU.
                self._cpu.pop(rank, None)
                self._io.pop(rank, None)
                self.rss.pop(rank, None)
                self._sample_io(rank, proc, now)
                continue
            try:
                with proc.oneshot():
                    cpu = proc.cpu_percent(None)
                    rss = proc.memory_info().rss
            except (psutil.Error, OSError):
                continue
            self.rss[rank] = int(rss)
            samples = self._cpu.setdefault(rank, deque())
            samples.append((now, float(cpu)))
            while samples and samples[0][0] < now - WINDOW_S:
                samples.popleft()
            self._sample_io(rank, proc, now)
        try:
            self._host.append((now, psutil.virtual_memory().percent / 100.0))
        except (OSError, RuntimeError):
            pass
        while self._host and self._host[0][0] < now - WINDOW_S:
            self._host.popleft()

    def _sample_io(self, rank: int, proc: psutil.Process, now: float) -> None:
        """One reading of the rank's I/O (none where the kernel does not count it, or does
        not let this process read it)."""
        try:
            with open(f"/proc/{proc.pid}/io", "rb") as f:
                moved = io_sum(f.read())
        except (OSError, ValueError, IndexError):
            return
        samples = self._io.setdefault(rank, deque())
        samples.append((now, moved))
        while samples and samples[0][0] < now - WINDOW_S:
            samples.popleft()

    def io_rate(self, window: float = WINDOW_S) -> dict[int, float]:
        """Each rank's I/O in bytes a second over its readings of the last ``window`` seconds
        (at most :data:`WINDOW_S`), counted back from its newest; ranks with fewer than two
        readings there are left out (unknown)."""
        out = {}
        for rank, samples in self._io.items():
            rate = counter_rate(samples, window)
            if rate is not None:
                out[rank] = rate
        return out

    def cpu_percent(self, window: float = WINDOW_S) -> dict[int, float]:
        """Each rank's mean CPU percent over its samples of the last ``window`` seconds
        (at most :data:`WINDOW_S`), counted back from its newest sample."""
        out = {}
        for rank, samples in self._cpu.items():
            if not samples:
                continue
            since = samples[-1][0] - window
            recent = [cpu for at, cpu in samples if at >= since]
            out[rank] = sum(recent) / len(recent)
        return out

    def memory_state(self) -> MemoryState:
        """Memory pressure now and over the recent past (for a SIGKILL's diagnosis)."""
        current, limit, kills = read_cgroup_memory(self.cgroup_root)
        host = max((f for _, f in self._host), default=None)
        return MemoryState(
            host_fraction=host,
            cgroup_current=current,
            cgroup_max=limit,
            oom_kills=max(0, (kills or 0) - (self.oom_kills_at_start or 0)),
        )


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None


def _own_cgroup(root: Path) -> Path:
    """This process's cgroup v2 directory (``0::/path`` in /proc/self/cgroup), else root."""
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                candidate = root / line[3:].lstrip("/")
                if (candidate / "memory.current").exists():
                    return candidate
    except OSError:
        pass
    return root


def read_cgroup_memory(root: str | Path = "/sys/fs/cgroup") -> tuple[int | None, int | None, int]:
    """``(current, limit, oom_kills)`` of this process's memory cgroup (v2, or v1's memory
    controller); None for what is unknown or unlimited, 0 kills when not counted."""
    root = Path(root)
    v2 = _own_cgroup(root)
    if (v2 / "memory.current").exists():
        current, limit = _read_int(v2 / "memory.current"), _read_int(v2 / "memory.max")
        events = v2 / "memory.events"
    else:
        v1 = root / "memory"
        current = _read_int(v1 / "memory.usage_in_bytes")
        limit = _read_int(v1 / "memory.limit_in_bytes")
        if limit is not None and limit >= 1 << 60:  # v1 says "unlimited" with a huge number
            limit = None
        events = v1 / "memory.oom_control"
    kills = 0
    try:
        for line in events.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                kills = int(value)
    except (OSError, UnicodeDecodeError):
        pass
    return current, limit, kills
