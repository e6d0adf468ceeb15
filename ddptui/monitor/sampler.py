"""A background thread that samples the system at a fixed interval.

The UI never waits on NVML or psutil: it either reads :meth:`Sampler.latest` (the last
finished snapshot) or receives each snapshot through ``callback``, which runs on the
sampler thread (a Textual app would hand it on with ``app.call_from_thread`` or
``post_message``).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any

from ddptui.monitor.snapshot import SystemSnapshot
from ddptui.monitor.system import SystemMonitor

__all__ = ["Sampler", "MIN_INTERVAL", "DEFAULT_INTERVAL", "validate_interval"]

log = logging.getLogger(__name__)

DEFAULT_INTERVAL = 1.0
#: Below this, sampling the host and the rank process trees (psutil) would dominate.
MIN_INTERVAL = 0.1


def validate_interval(interval: float) -> float:
    """Return ``interval`` as a float, or raise ValueError saying what is allowed."""
    try:
        value = float(interval)
    except (TypeError, ValueError):
        raise ValueError(
            f"monitor interval must be a number of seconds, got {interval!r}"
        ) from None
    if not math.isfinite(value) or value < MIN_INTERVAL:
        raise ValueError(f"monitor interval must be at least {MIN_INTERVAL} s, got {interval!r} s")
    return value


class Sampler:
    """Samples a :class:`SystemMonitor` every ``interval`` seconds on a daemon thread.

    >>> sampler = Sampler(interval=1.0, callback=on_snapshot)   # doctest: +SKIP
    >>> sampler.start()
    >>> sampler.set_pids([rank0_pid, rank1_pid])               # the ranks, once known
    >>> sampler.latest()                                        # last snapshot, or None
    >>> sampler.stop()                                          # joins; closes NVML

    If the sampler creates its monitor (``monitor=None``, with ``pcie`` as in
    :class:`SystemMonitor`: PCIe throughput on its own thread, off by default), :meth:`stop`
    closes it; a monitor passed in stays open (its owner closes it). Samples keep a fixed
    cadence: a slow sample delays the next one, it never causes a burst to catch up.
    """

    def __init__(
        self,
        monitor: SystemMonitor | None = None,
        *,
        interval: float = DEFAULT_INTERVAL,
        callback: Callable[[SystemSnapshot], Any] | None = None,
        pids: Iterable[int] = (),
        nvml_module: ModuleType | Any | None = None,
        pcie: bool | float = False,
        name: str = "ddptui-monitor",
    ) -> None:
        self.interval = validate_interval(interval)
        self._owns_monitor = monitor is None
        self._monitor = monitor if monitor is not None else SystemMonitor(nvml_module, pcie=pcie)
        self._callback = callback
        self._pids: tuple[int, ...] = tuple(pids)
        self._latest: SystemSnapshot | None = None
        self._count = 0
        self._cond = threading.Condition()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    # -- control ---------------------------------------------------------------------------

    def start(self) -> Sampler:
        """Start sampling (once per Sampler). Returns self, for chaining."""
        self._thread.start()
        return self

    def stop(self, timeout: float | None = 5.0) -> None:
        """Stop and join the thread, then close the monitor if this sampler created it."""
        self._stopping.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)
        if self._owns_monitor and not self._thread.is_alive():
            self._monitor.close()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def set_pids(self, pids: Iterable[int]) -> None:
        """Track these process trees (the ranks' pids) from the next sample on."""
        self._pids = tuple(pids)  # one atomic rebinding: the thread reads whole tuples

    def __enter__(self) -> Sampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- results ---------------------------------------------------------------------------

    def latest(self) -> SystemSnapshot | None:
        """The most recent snapshot, or None before the first one."""
        return self._latest

    @property
    def count(self) -> int:
        """How many snapshots have been taken."""
        return self._count

    def wait_for(self, count: int = 1, timeout: float | None = None) -> SystemSnapshot | None:
        """Block until at least ``count`` snapshots exist; return the latest (None on timeout)."""
        with self._cond:
            self._cond.wait_for(lambda: self._count >= count, timeout)
            return self._latest if self._count >= count else None

    # -- the thread ------------------------------------------------------------------------

    def _run(self) -> None:
        # Give CPU percentages a real window before the first sample.
        if self._stopping.wait(self._monitor.cpu_warmup_remaining()):
            return
        next_at = time.monotonic()
        while not self._stopping.is_set():
            try:
                snapshot = self._monitor.sample(self._pids)
            except Exception:  # a bug, not an NVML/psutil condition: keep the UI alive
                log.exception("monitor sample failed")
            else:
                with self._cond:
                    self._latest = snapshot
                    self._count += 1
                    self._cond.notify_all()
                if self._callback is not None:
                    try:
                        self._callback(snapshot)
                    except Exception:
                        log.exception("monitor callback failed")
            next_at += self.interval
            now = time.monotonic()
            if next_at < now:  # fell behind: skip the missed ticks
                next_at = now
            self._stopping.wait(next_at - now)
