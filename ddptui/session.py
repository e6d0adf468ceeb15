"""A run in progress: launcher + collector + RunState + the run directory.

Both front ends drive a :class:`RunSession` the same way: ``start()``, then ``pump()`` in a
loop (the headless loop, or a dashboard worker thread), then ``finish()`` or ``stop()``.
Every received event is appended to ``events.jsonl`` and flushed before it is applied, so a
crash of ddptui loses nothing already received.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from ddptui import protocol
from ddptui.collector import Collector, CollectorStats
from ddptui.config import RunConfig
from ddptui.launch import Launcher, LaunchResult, read_failure, tail_lines
from ddptui.rundir import CONFIG_FILE, EVENTS_FILE, RunDir, write_json_atomic
from ddptui.state import RankFailureInfo, RunState

#: After the launcher ends, keep reading this long for events still in flight.
DRAIN_SECONDS = 0.5


def make_launcher(cfg: RunConfig, endpoint: str | None) -> Launcher:
    from trainers import TRAINERS

    return Launcher(
        cfg.launcher,
        cfg.world_size,
        cfg.run_dir or ".",
        cfg.run_id,
        endpoint,
        module=None if cfg.script else TRAINERS[cfg.trainer],
        script=cfg.script,
        args=cfg.trainer_argv(),
    )


class RunSession:
    """Owns one run's processes, telemetry socket, state and files."""

    def __init__(self, cfg: RunConfig, clock: Callable[[], float] = time.monotonic) -> None:
        if not cfg.run_dir:
            raise ValueError("RunConfig.run_dir must be set")
        self.cfg = cfg
        self.clock = clock
        self.run_dir = Path(cfg.run_dir)
        self.state = RunState(cfg.run_id, cfg.world_size, epochs=cfg.epochs)
        self.collector: Collector | None = None
        self.launcher: Launcher | None = None
        self.result: LaunchResult | None = None
        self._events_file = None
        self.stats = CollectorStats()
        self._lock = threading.RLock()  # the dashboard reads state from another thread

    @property
    def events_path(self) -> Path:
        return self.run_dir / EVENTS_FILE

    def start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.run_dir / CONFIG_FILE, self.cfg.to_json_dict())
        self._events_file = open(self.events_path, "ab")
        self.collector = Collector(self.cfg.run_id, world_size=self.cfg.world_size)
        self.stats = self.collector.stats
        self.launcher = make_launcher(self.cfg, self.collector.endpoint)
        self.state.started_at = self.clock()
        self.launcher.start()

    def pump(self, timeout: float = 0.1) -> list[protocol.AnyEvent]:
        """Receive, persist and apply what has arrived (waiting up to ``timeout``)."""
        if self.collector is None:
            time.sleep(timeout)
            return []
        events = self.collector.poll(timeout)
        if events:
            self._record(events)
        return events

    def _record(self, events: list[protocol.AnyEvent]) -> None:
        assert self._events_file is not None
        self._events_file.write(b"".join(protocol.to_json(e) + b"\n" for e in events))
        self._events_file.flush()
        now = self.clock()
        with self._lock:
            for event in events:
                self.state.apply(event, now)

    def poll(self) -> LaunchResult | None:
        """The launcher's result once the run has ended (after draining late events)."""
        if self.result is not None or self.launcher is None:
            return self.result
        result = self.launcher.poll()
        if result is not None:
            self._conclude(result)
        return self.result

    def stop(self) -> LaunchResult | None:
        """Stop every worker (SIGTERM, grace, SIGKILL) and record the run as stopped."""
        if self.result is None and self.launcher is not None:
            self._conclude(self.launcher.stop())
        return self.result

    def _conclude(self, result: LaunchResult) -> None:
        deadline = time.monotonic() + DRAIN_SECONDS
        while time.monotonic() < deadline and self.collector is not None:
            if not self.pump(0.05) and time.monotonic() > deadline - DRAIN_SECONDS / 2:
                break
        with self._lock:
            self.state.set_outcome(result.outcome, result.failure, now=self.clock())
        self.result = result

    def close(self) -> None:
        """Stop anything still running and release the socket and files."""
        if self.launcher is not None and self.result is None:
            self.stop()
        if self.collector is not None:
            self.collector.close()
            self.collector = None
        if self._events_file is not None:
            self._events_file.close()
            self._events_file = None

    def __enter__(self) -> RunSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def locked(self) -> threading.RLock:
        """Hold while reading ``state`` from a thread other than the one pumping."""
        return self._lock


def read_events(path: Path, run_id: str | None = None) -> Iterator[protocol.AnyEvent]:
    """Events of a run directory's ``events.jsonl`` (only run ``run_id``'s, when given);
    lines that do not parse are skipped (a crash may leave the last line half-written)."""
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                try:
                    event = protocol.from_json(line)
                except protocol.InvalidEvent:
                    continue
                if run_id is None or event.run == run_id:
                    yield event


def load_run(run_dir: Path) -> tuple[dict, RunState]:
    """Config and replayed state of a finished or crashed run directory."""
    config = json.loads((run_dir / CONFIG_FILE).read_text())
    state = RunState(
        config.get("run_id", run_dir.name),
        int(config.get("world_size") or 1),
        epochs=config.get("epochs"),
    )
    for event in read_events(run_dir / EVENTS_FILE, config.get("run_id")):
        state.apply(event)
    ended = [v.state for v in state.ranks.values()]
    failure = read_failure(run_dir)
    if failure is None:
        failed = [v for v in state.ranks.values() if v.state == "failed"]
        if failed:
            failure = RankFailureInfo(
                rank=failed[0].rank,
                error=failed[0].error,
                stderr_tail=tuple(tail_lines(RunDir(run_dir).rank_log(failed[0].rank))),
            )
    if failure is not None:
        state.set_outcome("failed", failure)
    elif ended and all(s == "finished" for s in ended):
        state.set_outcome("finished")
    return config, state
