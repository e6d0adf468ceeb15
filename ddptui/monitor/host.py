"""Host and process sampling through psutil.

CPU percentages are deltas between two readings of cumulative CPU times, so the first
reading has nothing to compare with. :class:`HostSource` handles that itself:

* Whole-machine and per-core CPU: primed when the source is created; each
  :meth:`~HostSource.sample` reports the busy share since the previous one. The state is
  per source (not psutil's), so other psutil users in the process do not disturb it.
* Per process: ``psutil.Process`` objects are cached between samples (their
  ``cpu_percent`` keeps the previous reading); a pid seen for the first time reports
  ``NA`` for CPU, and a real value from the next sample on.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import psutil

from ddptui.monitor.snapshot import NA, HostSnapshot, NotAvailable, ProcessSnapshot

__all__ = ["HostSource", "MIN_CPU_WINDOW_S"]

#: A CPU percentage over a shorter window than this is mostly rounding noise (the kernel
#: counts CPU time in clock ticks, typically 10 ms); samplers wait this long after priming.
MIN_CPU_WINDOW_S = 0.1

_PROCESS_ATTRS = ("ppid", "name", "status", "memory_info", "num_threads")
#: The whole process table (one read of ``/proc/<pid>/stat`` per process on the host: 2 ms
#: for 76 processes here, tens of ms on a busy node) is read to find the processes new in the
#: rank trees at most this often; sooner when a root is new or a process of the trees is gone
#: (a DataLoader's workers ended at an epoch's end, their successors to be found). Between
#: scans the trees found last are sampled, each process read as before. Read every second,
#: the table cost the dashboard 0.45 % of a core with 76 processes (py-spy, ``bench_scale.py``).
TREE_RESCAN_S = 5.0


class HostSource:
    """Samples CPU, load, RAM and swap, and a tree of processes given by root pids.

    Thread-safe (one lock); sampling is meant to run on one background thread.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._cpu_count = psutil.cpu_count() or 1
        total, per_core = self._read_cpu_times()
        self._cpu_total = _CpuMeter(total)
        self._cpu_cores = [_CpuMeter(t) for t in per_core]
        self._last_read = time.monotonic()
        self._procs: dict[int, psutil.Process] = {}
        self._unprimed: set[int] = set()  # pids primed but not yet sampled
        #: ppid -> child pids as the last scan of the process table found them (None: scan).
        self._children_of: dict[int, list[int]] | None = None
        self._scanned_at = 0.0
        self._scanned_roots: frozenset[int] = frozenset()

    @staticmethod
    def _read_cpu_times() -> tuple[Any, list[Any]]:
        return psutil.cpu_times(), psutil.cpu_times(percpu=True)

    def cpu_warmup_remaining(self) -> float:
        """Seconds until the CPU window since the last reading reaches MIN_CPU_WINDOW_S."""
        return max(0.0, MIN_CPU_WINDOW_S - (time.monotonic() - self._last_read))

    def sample(self, pids: Iterable[int] = ()) -> tuple[HostSnapshot, tuple[ProcessSnapshot, ...]]:
        """One reading of the host, plus every process in the trees rooted at ``pids``.

        Roots that no longer exist are left out. A process gone is gone from the next
        sample; a new child (a DataLoader worker) is found within :data:`TREE_RESCAN_S`, or
        at the next sample after one of the trees' processes ended.
        """
        with self._lock:
            host = self._sample_host()
            processes = self._sample_processes(pids)
            return host, processes

    # -- host ------------------------------------------------------------------------------

    def _sample_host(self) -> HostSnapshot:
        total, per_core = self._read_cpu_times()
        self._last_read = time.monotonic()
        cpu = self._cpu_total.update(total)
        if len(per_core) != len(self._cpu_cores):  # a CPU went on- or offline
            self._cpu_cores = [_CpuMeter(t) for t in per_core]
        cores = tuple(meter.update(t) for meter, t in zip(self._cpu_cores, per_core, strict=True))
        if any(c is NA for c in cores):
            cores = ()
        mem = psutil.virtual_memory()
        swap = psutil.swap_memory()
        try:
            load = tuple(os.getloadavg())
        except (AttributeError, OSError):  # Windows has none
            load = NA
        return HostSnapshot(
            cpu_percent=cpu,
            cpu_percent_per_core=cores,
            cpu_count=self._cpu_count,
            load_average=load,  # type: ignore[arg-type]
            memory_total=mem.total,
            memory_used=mem.total - mem.available,
            memory_available=mem.available,
            memory_percent=mem.percent,
            swap_total=swap.total,
            swap_used=swap.used,
            swap_percent=swap.percent,
        )

    # -- processes -------------------------------------------------------------------------

    def _sample_processes(self, pids: Iterable[int]) -> tuple[ProcessSnapshot, ...]:
        roots = list(dict.fromkeys(pids))  # unique, order kept
        found: dict[int, tuple[psutil.Process, int]] = {}  # pid -> (process, root)
        if roots:
            # One scan of the process table for all roots (psutil's children() would scan
            # once per root), kept for TREE_RESCAN_S.
            children_of = self._children(roots)
            for root in roots:
                if root in found or (root_proc := self._process(root)) is None:
                    continue  # already in an earlier tree, or gone
                found[root] = (root_proc, root)
                for pid in _tree(root, children_of)[1:]:
                    if pid in found:
                        continue
                    if (proc := self._process(pid)) is None:
                        self._children_of = None  # gone: the trees to be read again
                    else:
                        found[pid] = (proc, root)
        # Forget processes that left the trees, so a reused pid starts from scratch.
        for pid in list(self._procs):
            if pid not in found:
                self._forget(pid)
        snapshots = []
        for proc, root in found.values():
            snap = self._snapshot(proc, root)
            if snap is None:
                self._children_of = None
            else:
                snapshots.append(snap)
        return tuple(snapshots)

    def _children(self, roots: list[int]) -> dict[int, list[int]]:
        """ppid -> child pids: the last scan's, or a new one when it is stale (see
        :data:`TREE_RESCAN_S`) or a root is new."""
        now = self._clock()
        if (
            self._children_of is None
            or not self._scanned_roots.issuperset(roots)
            or not 0.0 <= now - self._scanned_at < TREE_RESCAN_S
        ):
            self._children_of = _children_map()
            self._scanned_at = now
            self._scanned_roots = frozenset(roots)
        return self._children_of

    def _forget(self, pid: int) -> None:
        """Drop what is kept of ``pid`` (gone, or out of the trees): a reused pid starts anew."""
        self._procs.pop(pid, None)
        self._unprimed.discard(pid)

    def _process(self, pid: int) -> psutil.Process | None:
        """The cached Process for ``pid`` (if it is still the same process), else a new one."""
        cached = self._procs.get(pid)
        if cached is not None:
            if cached.is_running():  # also false when the pid was reused
                return cached
            # Gone (a reused pid is another process, maybe no longer in the trees): the
            # trees are read again at the next sample.
            self._forget(pid)
            return None
        try:
            proc = psutil.Process(pid)
            proc.cpu_percent(None)  # prime: the first call has no previous reading
        except (psutil.Error, ValueError):
            return None
        self._procs[pid] = proc
        self._unprimed.add(pid)
        return proc

    def _snapshot(self, proc: psutil.Process, root: int) -> ProcessSnapshot | None:
        pid = proc.pid
        cpu: float | NotAvailable = NA
        try:
            with proc.oneshot():
                info = proc.as_dict(_PROCESS_ATTRS, ad_value=NA)
                # Right after priming there is no window yet: report NA, not a fake 0.
                if pid in self._unprimed:
                    self._unprimed.discard(pid)
                else:
                    try:
                        cpu = proc.cpu_percent(None)
                    except (psutil.ZombieProcess, psutil.AccessDenied):
                        pass
        except psutil.NoSuchProcess:
            self._forget(pid)
            return None
        mem = info.get("memory_info", NA)
        return ProcessSnapshot(
            pid=pid,
            root=root,
            ppid=info.get("ppid", NA),
            name=info.get("name", NA),
            status=info.get("status", NA),
            cpu_percent=cpu,
            rss=NA if mem is NA else mem.rss,
            num_threads=info.get("num_threads", NA),
        )


def _children_map() -> dict[int, list[int]]:
    """ppid -> child pids, from one pass over the process table."""
    # psutil's own (private) helper behind Process.children(): one read of /proc/*/stat.
    pairs: list[tuple[int, int]] | None = None
    ppid_map = getattr(psutil, "_ppid_map", None)
    if ppid_map is not None:
        try:
            pairs = list(ppid_map().items())
        except Exception:  # noqa: BLE001 - private and may change: use the public API
            pairs = None
    if pairs is None:
        pairs = [(p.pid, p.info["ppid"]) for p in psutil.process_iter(["ppid"])]
    children: dict[int, list[int]] = {}
    for pid, ppid in pairs:
        children.setdefault(ppid, []).append(pid)
    return children


def _tree(root: int, children_of: dict[int, list[int]]) -> list[int]:
    """``root`` and all its descendants, root first (a pid that is gone is skipped later)."""
    out, stack, seen = [], [root], set()
    while stack:
        pid = stack.pop()
        if pid in seen:  # a pid reused mid-scan could make a cycle
            continue
        seen.add(pid)
        out.append(pid)
        stack.extend(reversed(children_of.get(pid, ())))
    return out


class _CpuMeter:
    """Busy percent of one CPU (or all) between readings of its cumulative ``cpu_times``.

    A window in which the kernel accounted no time at all (shorter than a clock tick, or a
    virtual machine whose vCPU the host paused) has no answer: the meter then keeps its
    baseline, so the next window is longer, and repeats its last value (NA before it has
    one) rather than inventing a 0 or a 100.
    """

    __slots__ = ("_baseline", "_value")

    def __init__(self, times: Any) -> None:
        self._baseline = times
        self._value: float | NotAvailable = NA

    def update(self, times: Any) -> float | NotAvailable:
        # Field by field, negative deltas count as 0: Linux iowait, for one, can go
        # backwards (psutil and top do the same).
        deltas = {
            f: max(0.0, getattr(times, f) - getattr(self._baseline, f)) for f in times._fields
        }
        # On Linux guest time is already counted in user and nice time.
        total = sum(deltas.values()) - deltas.get("guest", 0.0) - deltas.get("guest_nice", 0.0)
        if total <= 0:
            return self._value
        idle = deltas.get("idle", 0.0) + deltas.get("iowait", 0.0)
        self._baseline = times
        self._value = round(min(100.0, max(0.0, 100.0 * (total - idle) / total)), 1)
        return self._value
