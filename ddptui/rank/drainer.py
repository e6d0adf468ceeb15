"""A daemon thread that runs a drain function every interval while there is work for it.

The zero-code instrumentation finishes a step in a hook on the training thread; turning the
step into an event and handing it to ZeroMQ costs tens of microseconds there, most of it
cold-cache Python after the step's kernels. A :class:`Drainer` moves that work off the step
path: the hook appends the step to a queue and calls :meth:`Drainer.poke` (an attribute test
while the thread is awake); the thread wakes at most every ``interval`` seconds, drains the
queue in one batch (warm after its first item), and goes back to sleep once a drain finds
nothing. Torch releases the GIL in its kernels, so the drain mostly overlaps them.

The thread starts on the first poke, and again in a forked child (threads do not survive a
fork; ``os.register_at_fork`` forgets the parent's).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable

_drainers: weakref.WeakSet[Drainer] = weakref.WeakSet()


class Drainer:
    """Runs ``drain()`` (returns whether work is left) on its own thread while there is work.

    ``poke()`` says work arrived (drained within ``interval``); ``now()`` asks for a drain
    at once; ``stop()`` ends the thread (the caller drains what is left itself).
    """

    def __init__(self, drain: Callable[[], bool], interval: float, name: str) -> None:
        self._drain = drain
        self.interval = interval
        self.name = name
        #: The thread is running its loop (set while it drains or waits for the interval).
        self.awake = False
        self._wake = threading.Event()  # set by poke/now/stop: the sleeping thread wakes
        self._hurry = threading.Event()  # set by now/stop: the interval wait ends early
        self._stopped = False
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # starting the thread
        _drainers.add(self)

    def poke(self) -> None:
        """Work arrived: drain it within the interval. Cheap while the thread is awake."""
        if not self.awake:
            self._start_or_wake()

    def now(self) -> None:
        """Drain as soon as the thread gets the GIL, without waiting for the interval."""
        self._hurry.set()
        self._start_or_wake()

    def stop(self, timeout: float = 1.0) -> None:
        """End the thread (waiting at most ``timeout`` for a drain under way)."""
        self._stopped = True
        self._hurry.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _start_or_wake(self) -> None:
        if self._stopped:
            return
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self.awake = True  # no second start from the next poke
                    thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                    self._thread = thread
                    thread.start()
                    return
        self._wake.set()

    def _run(self) -> None:
        wake, hurry = self._wake, self._hurry
        while not self._stopped:
            self.awake = True
            while not self._stopped:
                hurry.wait(self.interval)
                hurry.clear()
                if self._stopped or not self._safe_drain():
                    break
            self.awake = False
            # Work that came between the last drain and ``awake`` turning false saw the
            # thread awake and did not wake it: look once more before sleeping.
            if self._stopped or self._safe_drain():
                continue
            wake.wait()
            wake.clear()

    def _safe_drain(self) -> bool:
        try:
            return bool(self._drain())
        except Exception:
            return False  # the owner reports its own failures; the thread stays

    def _after_fork(self) -> None:
        self._thread = None
        self.awake = False
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._hurry = threading.Event()


def _forget_threads_after_fork() -> None:
    for drainer in list(_drainers):
        drainer._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_threads_after_fork)
