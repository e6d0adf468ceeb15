"""Where the run screen's data comes from: a live :class:`RunSession`, or a replayed run.

The run screen only reads ``source.state`` (under ``source.locked()``) and calls
``source.now()``; it never touches sockets or processes. A :class:`LiveSource` is driven by
exactly one thread (the screen's worker): ``start``/``pump``/``poll``/``stop``/``close`` all
happen there, because the session's ZeroMQ socket is not thread-safe and belongs to the
thread that created it. Other threads only *ask* it to stop
(:meth:`LiveSource.request_stop`) and wait on :attr:`LiveSource.done`; when nothing drives
it, :meth:`LiveSource.abandon` makes sure nothing ever will; and as a last resort, when the
driving thread is stuck, :meth:`LiveSource.kill_workers` ends the worker processes without
touching the socket.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ddptui.run.diagnosis import shown_details
from ddptui.run.launcher import LaunchResult
from ddptui.run.options import RunConfig
from ddptui.run.rundir import load_run, unread_note
from ddptui.run.session import RunSession
from ddptui.run.state import RunState
from ddptui.runfiles import RunDir

#: How long one pump waits for events; also how quickly a stop request is noticed.
PUMP_TIMEOUT_S = 0.1
#: While events flow and a screen draws the run, the driving thread pumps when the screen is
#: about to draw (:meth:`LiveSource.catch_up`), waiting at most this long for it between
#: pumps: each pump then takes what came since the last frame, a few times a second.
#: Pumping 20 times a second (50 ms apart, as before) cost twice the CPU for the same events:
#: each pump comes to its code and data after a sleep, out of the CPU's caches, and 26 events
#: processed 50 ms apart cost 24 us each against 8-12 us one after the other (the 8-rank
#: bench's events, offline). Events wait in the socket meanwhile; a frame shows every event
#: that came before it, not only those of the last pump 0-50 ms before it.
PUMP_PARK_S = 0.5
#: Where no frame asked for a pump within PUMP_PARK_S (no screen draws this run: it is behind
#: another, or nothing shows it), pumps while events flow are at least this far apart, so
#: that each takes a batch instead of a few events.
PUMP_MIN_INTERVAL_S = 0.05
#: The most a frame waits for the pump it asked for (it draws what is there after that).
CATCH_UP_S = 0.1


class RunSource:
    """Read side shared by every source: config, state, its lock and its clock."""

    live: bool = False
    #: Shown next to the run's state in the header (e.g. "replay").
    note: str = ""

    def __init__(self, config: dict[str, Any], state: RunState, run_dir: Path | None) -> None:
        self.config = config
        self.state = state
        self.run_dir = run_dir
        self._lock: Any = threading.RLock()
        #: What the diagnosis found (one line each), for a replayed run from its summary.
        self.recorded_diagnoses: list[str] = []

    def diagnoses(self) -> list[str]:
        """What the diagnosis found so far (stragglers, hangs, crash causes), one line each."""
        return self.recorded_diagnoses

    def locked(self) -> contextlib.AbstractContextManager[Any]:
        """Hold while reading :attr:`state`."""
        return self._lock

    def now(self) -> float:
        """The clock :attr:`state` was built with (for elapsed, ETA, last seen, health)."""
        return time.monotonic()

    @property
    def running(self) -> bool:
        """True while the run may still change (a live run not yet ended)."""
        return False

    def log_path(self, rank: int) -> Path | None:
        return RunDir(self.run_dir).rank_log(rank) if self.run_dir else None


class ReplaySource(RunSource):
    """A finished or crashed run read back from its run directory (or a RunState in tests).

    Time stands still at ``now`` (default: the last event), so a replay shows the run as it
    was when it ended, and tests get a frozen clock.
    """

    def __init__(
        self,
        config: dict[str, Any],
        state: RunState,
        run_dir: Path | None = None,
        now: float | None = None,
        note: str = "replay",
    ) -> None:
        super().__init__(config, state, run_dir)
        self._now = now
        self.note = note

    @classmethod
    def load(cls, run_dir: Path, now: float | None = None) -> ReplaySource:
        run_dir = Path(run_dir)
        config, state, summary = load_run(run_dir)
        note = "replay"
        if state.lines_unread:
            note += f" · events.jsonl: {unread_note(state.lines_unread)}"
        source = cls(config, state, run_dir, now, note=note)
        source.recorded_diagnoses = shown_details(
            (_rank(d.get("rank")), str(d.get("cause")), str(d.get("detail")))
            for d in summary.get("diagnoses") or ()
            if isinstance(d, dict)
        )
        return source

    def now(self) -> float:
        if self._now is not None:
            return self._now
        return self.state.finished_at or self.state.last_event_at or 0.0


def _rank(value: object) -> int | None:
    """A rank read from a run's files: an int, else None (the file may say anything)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class LiveSource(RunSource):
    """A run launched from the dashboard. :meth:`drive` runs it on a worker thread."""

    live = True

    def __init__(
        self, cfg: RunConfig, session_factory: Callable[[RunConfig], RunSession] = RunSession
    ) -> None:
        self.cfg = cfg
        self.session = session_factory(cfg)
        super().__init__(cfg.to_json_dict(), self.session.state, self.session.run_dir)
        self.result: LaunchResult | None = None
        self.error: str | None = None  # why the run could not start or was lost
        self.started = threading.Event()
        self.done = threading.Event()
        self._stop = threading.Event()
        self._gentle = threading.Event()  # asked: stop after the current step, checkpointed
        #: The ranks were asked to stop with a checkpoint (and are doing it).
        self.checkpoint_stop = False
        self._claim = threading.Lock()
        #: The thread that drives the session (and owns its socket), once one does.
        self.driver: threading.Thread | None = None
        self._abandoned = False
        self._interrupted: int | None = None
        #: Set to have the driving thread pump now (a frame is due, or a stop asked for).
        self._wake = threading.Event()
        #: The driving thread waits for :attr:`_wake` between pumps while events flow.
        self._parked = False
        #: When a frame last asked for a pump (:meth:`catch_up`), on the monotonic clock.
        self._asked_at = float("-inf")
        #: Pumps done so far, under the condition a frame waits on (see catch_up).
        self._pumps = 0
        self._pumped = threading.Condition()

    def locked(self) -> contextlib.AbstractContextManager[Any]:
        return self.session.locked()

    def diagnoses(self) -> list[str]:
        diagnoser = getattr(self.session, "diagnoser", None)
        if diagnoser is None:
            return []
        return shown_details((d.rank, d.cause, d.detail) for d in diagnoser.diagnoses)

    def now(self) -> float:
        return self.session.clock()

    @property
    def running(self) -> bool:
        return not self.done.is_set()

    @property
    def stop_requested(self) -> bool:
        return self._stop.is_set()

    def request_stop(self) -> None:
        """Ask the driving thread to stop every worker (returns at once)."""
        self._stop.set()
        self._wake.set()

    def interrupt(self, exit_code: int) -> None:
        """As :meth:`request_stop`, for a signal to ddptui: the run ends ``interrupted``
        with ``exit_code`` (128 + the signal), as ``ddptui --no-ui``'s does."""
        self._interrupted = exit_code
        self._stop.set()
        self._wake.set()

    def catch_up(self, timeout: float = CATCH_UP_S) -> None:
        """Before a frame is drawn (from the screen's thread): if the driving thread waits
        between pumps, have it pump what has come since, and wait for that (up to
        ``timeout``), so that the frame shows every event that came before it. Returns at
        once when the driving thread is pumping, or waiting on the socket with nothing
        come."""
        self._asked_at = time.monotonic()
        if not self._parked or threading.current_thread() is self.driver:
            return
        with self._pumped:
            seen = self._pumps
            self._wake.set()
            self._pumped.wait_for(lambda: self._pumps != seen or self.done.is_set(), timeout)

    def _pumped_once(self) -> None:
        with self._pumped:
            self._pumps += 1
            self._pumped.notify_all()

    def _park(self, began: float, cancelled: Callable[[], bool]) -> None:
        """Between pumps while events flow (the last began at ``began``): while a screen
        draws the run, until its next frame is due, at most :data:`PUMP_PARK_S`; else until
        :data:`PUMP_MIN_INTERVAL_S` after the last pump began. A stop asked for ends the wait
        at once, a cancelled worker within :data:`PUMP_TIMEOUT_S`, as before."""
        drawn = time.monotonic() - self._asked_at < PUMP_PARK_S
        self._parked = drawn
        try:
            deadline = time.monotonic() + PUMP_PARK_S if drawn else began + PUMP_MIN_INTERVAL_S
            while not self._wake.is_set() and not cancelled():
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._wake.wait(min(left, PUMP_TIMEOUT_S))
        finally:
            self._parked = False

    def _halt(self) -> LaunchResult | None:
        if self._interrupted is None:
            return self.session.stop()
        return self.session.stop(interrupted=True, exit_code=self._interrupted)

    def request_checkpoint_stop(self) -> None:
        """Ask the driving thread to have a built-in trainer's ranks stop after the current
        step with a checkpoint; where that cannot be done, or once it was asked already, it
        stops every worker (returns at once)."""
        if self._gentle.is_set():
            self._stop.set()
        self._gentle.set()
        self._wake.set()

    def abandon(self) -> bool:
        """If no thread drives this source yet, make sure none ever will and mark it done
        (nothing was started, so there is nothing to stop or close). False when a thread
        already drives it: then wait on :attr:`done`."""
        with self._claim:
            if self.driver is not None:
                return False
            self._abandoned = True
        self.done.set()
        return True

    def _stop_with_checkpoint(self) -> None:
        ask = getattr(self.session, "stop_with_checkpoint", None)
        if ask is not None and ask():
            self.checkpoint_stop = True
        else:
            self._stop.set()

    def kill_workers(self) -> None:
        """Last resort, from any thread, when the driving thread is stuck: end the run's
        worker processes. The session's socket and files are left to the driving thread,
        which owns them and closes them when it gets going again (or process exit does)."""
        launcher = getattr(self.session, "launcher", None)
        if launcher is not None:
            with contextlib.suppress(Exception):
                launcher.stop()

    def drive(self, cancelled: Callable[[], bool] = lambda: False) -> LaunchResult | None:
        """Start the run and pump it until it ends or a stop is requested (blocking).

        Always leaves nothing running: the session is stopped and closed on every way out,
        on this thread (the one that created the session's socket in ``start``).
        """
        with self._claim:
            if self._abandoned or self.driver is not None:
                return self.result  # given up on before it started, or driven elsewhere
            self.driver = threading.current_thread()
        try:
            self.session.start()
            self.started.set()
            while self.result is None:
                if self._gentle.is_set() and not self.checkpoint_stop:
                    self._stop_with_checkpoint()
                overdue = getattr(self.session, "stop_overdue", None)
                if self._stop.is_set() or cancelled() or (overdue is not None and overdue()):
                    self.result = self._halt()
                    break
                asked = self._wake.is_set()
                self._wake.clear()
                began = time.monotonic()
                # Asked (a frame is due): what is there now, without waiting for more.
                pumped = self.session.pump(0.0 if asked else PUMP_TIMEOUT_S)
                self._pumped_once()
                self.result = self.session.poll()
                if pumped and self.result is None:
                    self._park(began, cancelled)
        except Exception as exc:  # a launch that cannot start: say why on screen
            self.error = f"{type(exc).__name__}: {exc}"
            with contextlib.suppress(Exception):
                self.result = self.session.stop()
        finally:
            with contextlib.suppress(Exception):
                self.session.close()
            self.done.set()
            self._pumped_once()  # a frame waiting for a pump waits no more
        return self.result
