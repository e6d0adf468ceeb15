"""A run that another ddptui process owns, followed through its run directory.

:class:`FollowSource` tails ``events.jsonl`` as it grows (every :data:`POLL_S`, so what a
rank logs shows within a second) into its own :class:`RunState`, and notices the end: the
run's ``summary.json`` appears (its outcome and failure are taken from it), or no process
carries the run's id any more and no summary came within :data:`LOST_GRACE_S` (the owning
ddptui was killed; the outcome is derived from the events, as replay does).

Times are wall-clock: every event is applied at its own ``t`` and :meth:`now` is
``time.time()``, so elapsed, last seen and ETA are right for events written before attaching.
No Textual here: the screen only reads :attr:`state` under :meth:`locked`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from ddptui import safeio
from ddptui.argv import config_script_epochs
from ddptui.run.quiet_gc import quiet_collector
from ddptui.run.rundir import events_in, load_run, read_config
from ddptui.run.state import RunState
from ddptui.runfiles import RunDir
from ddptui.runs.live import run_is_alive
from ddptui.tui.sources import RunSource

#: Seconds between reads of events.jsonl.
POLL_S = 0.2
#: Seconds between looks for the run's processes (a pass over the process table).
ALIVE_EVERY_S = 2.0
#: After the processes are gone, wait this long for summary.json before calling the run lost.
LOST_GRACE_S = 5.0
#: Most bytes read per poll (a huge backlog is read over several polls).
MAX_READ = 8 * 1024 * 1024
#: A "line" longer than this without a newline is not an event: dropped.
MAX_LINE = 1024 * 1024


class FollowSource(RunSource):
    """Follows a run directory that another process writes."""

    live = False

    def __init__(
        self,
        run_dir: str | Path,
        alive: Callable[[str], bool] = run_is_alive,
        clock: Callable[[], float] = time.time,
    ) -> None:
        run_dir = Path(run_dir)
        config = read_config(run_dir)  # RunDirError (one line) when it is not a run
        run_id = str(config.get("run_id") or run_dir.name)
        state = RunState(
            run_id,
            int(config.get("world_size") or 1),
            config.get("epochs"),
            config_script_epochs(config),
        )
        super().__init__(config, state, run_dir)
        self.files = RunDir(run_dir)
        self._alive = alive
        self._clock = clock
        try:  # ddptui writes config.json as it launches: that is when the run started
            state.started_at = self.files.config.stat().st_mtime
        except OSError:
            pass
        self._offset = 0
        self._partial = b""
        self._next_alive_check = 0.0
        self._gone_since: float | None = None
        #: How the run ended, in words, once it has (None while it runs).
        self.ended: str | None = None
        self.skipped_lines = 0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    # -- what the screen reads -------------------------------------------------------------
    def now(self) -> float:
        return self._clock()

    @property
    def running(self) -> bool:
        return self.ended is None

    @property
    def note(self) -> str:  # type: ignore[override]
        if self.ended is None:
            return "attached: following events.jsonl"
        return f"attached: {self.ended}"

    # -- following -------------------------------------------------------------------------
    def poll(self) -> int:
        """Read what was appended, apply it, and check for the end. Returns events applied."""
        if self.ended is not None:
            return 0
        summary_seen = self.files.summary.exists()  # before reading: the events come first
        applied = self._read_new()
        if summary_seen:
            self._finish("the run has ended")
            return applied
        now = time.monotonic()
        if now >= self._next_alive_check:
            self._next_alive_check = now + ALIVE_EVERY_S
            if self._alive(self.state.run_id):
                self._gone_since = None
            elif self._gone_since is None:
                self._gone_since = now
        if self._gone_since is not None and now - self._gone_since >= LOST_GRACE_S:
            self._read_new()
            self._finish("the run's processes are gone and it wrote no summary.json")
        return applied

    def _skipped(self) -> None:
        self.skipped_lines += 1

    def _read_new(self) -> int:
        try:
            with safeio.open_regular(self.files.events) as f:  # a FIFO: nothing, never a wait
                f.seek(self._offset)
                data = f.read(MAX_READ)
        except OSError:
            return 0
        if not data:
            return 0
        self._offset += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()  # b"" after a newline; else a line still being written
        if len(self._partial) > MAX_LINE:
            self._partial = b""
            self.skipped_lines += 1
        events = list(events_in(lines, self.state.run_id, self._skipped))
        if events:
            with self._lock:
                first = min(e.t for e in events)
                if self.state.started_at is None or first < self.state.started_at:
                    self.state.started_at = first  # config.json was copied after the fact
                for event in events:
                    self.state.apply(event, event.t)
        return len(events)

    def _finish(self, why: str) -> None:
        """The run ended: take its outcome and failure from summary.json (or derive them)."""
        try:
            _, ended, summary = load_run(self.run_dir)
        except Exception as exc:  # a broken run directory: still say that the run ended
            with self._lock:
                self.state.set_outcome("interrupted")
            self.ended = f"{why} (cannot read it: {exc})"
            return
        with self._lock:
            self.state.set_outcome(ended.outcome or summary["outcome"], ended.failure)
        self.ended = f"{why}: {summary['outcome']}"

    # -- the follower thread -----------------------------------------------------------------
    def start(self) -> FollowSource:
        """Follow on a daemon thread until the run ends or :meth:`close`."""
        if self._thread is None:
            quiet_collector()  # as a live run's session does
            self._thread = threading.Thread(target=self._run, name="ddptui-follow", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set() and self.ended is None:
            try:
                self.poll()
            except Exception as exc:  # never let the follower die silently
                self.ended = f"stopped following: {type(exc).__name__}: {exc}"
                return
            self._stop.wait(POLL_S)

    def close(self, timeout: float = 2.0) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
