"""A run in progress: launcher + collector + RunState + the run directory.

Both front ends drive a :class:`RunSession` the same way: ``start()``, then ``pump()`` and
``poll()`` in a loop (the headless loop, or a dashboard worker thread), ``stop()`` on the
user's request, and ``close()`` on every way out, which writes ``summary.json``.
Every received event is appended to ``events.jsonl`` and flushed before it is applied, so a
crash of ddptui loses nothing already received. When the run directory fails (disk full,
permission lost) the session stops every worker, keeps what was written and says why in
:attr:`RunSession.fault`.
"""

from __future__ import annotations

import dataclasses
import errno
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ddptui import protocol
from ddptui.collector import Collector, CollectorStats
from ddptui.config import RunConfig
from ddptui.launch import Launcher, LaunchResult, Rendezvous
from ddptui.rundir import (
    EXIT_CODES,
    RunDir,
    RunDirError,
    decide_outcome,
    summarize,
    write_json_atomic,
    write_summary,
)
from ddptui.state import RankFailureInfo, RunState

#: After the launcher ends, keep reading this long for events still in flight.
DRAIN_SECONDS = 0.5
#: A multi-node run whose ranks here failed waits this long for another node's report of
#: the rank that failed first.
REMOTE_FAILURE_WAIT_S = 2.0


def make_launcher(
    cfg: RunConfig, endpoint: str | None, rendezvous: Rendezvous | None = None
) -> Launcher:
    """The launcher of this machine's ranks (a multi-node run: node ``rendezvous.node_rank``'s
    ``nproc_per_node`` ranks under torchrun's c10d rendezvous)."""
    return Launcher(
        "torchrun" if rendezvous is not None else cfg.launcher,
        cfg.nproc_per_node if rendezvous is not None else cfg.world_size,
        cfg.run_dir or ".",
        cfg.run_id,
        endpoint,
        module=None if cfg.script else cfg.trainer_module,
        script=cfg.script,
        args=cfg.trainer_argv(),
        env=cfg.rank_environment(),
        rendezvous=rendezvous,
    )


def os_error_message(path: Path, exc: OSError, doing: str = "write") -> str:
    """One line naming the file and the errno: ``cannot write …/events.jsonl: No space left
    on device (ENOSPC)``."""
    name = errno.errorcode.get(exc.errno or 0, "")
    why = exc.strerror or str(exc)
    return f"cannot {doing} {path}: {why}" + (f" ({name})" if name else "")


class RunSession:
    """Owns one run's processes, telemetry socket, state and files."""

    def __init__(self, cfg: RunConfig, clock: Callable[[], float] = time.monotonic) -> None:
        if not cfg.run_dir:
            raise ValueError("RunConfig.run_dir must be set")
        self.cfg = cfg
        self.clock = clock
        self.run_dir = Path(cfg.run_dir)
        self.files = RunDir(self.run_dir)
        self.state = RunState(cfg.run_id, cfg.world_size, epochs=cfg.epochs)
        self.collector: Collector | None = None
        self.launcher: Launcher | None = None
        self.result: LaunchResult | None = None
        #: Why the run directory failed (one line), or None.
        self.fault: str | None = None
        #: The summary.json document, once the run has ended.
        self.summary: dict | None = None
        self._events_file = None
        self._interrupted = False
        self._exit_code: int | None = None
        self.stats = CollectorStats()
        self._lock = threading.RLock()  # the dashboard reads state from another thread
        #: A multi-node run's node 0 side (keys, join service, CURVE inbox), or None.
        self.host = None
        #: The first failure another node reported (it tears this node down too).
        self.remote_failure: RankFailureInfo | None = None
        self._concluding = False

    @property
    def join_line(self) -> str | None:
        """A multi-node run started by hand: the ``ddptui join …`` command every other node
        runs (it holds the run's client secret: show it to the user, never log it)."""
        if self.host is None or self.cfg.launcher == "slurm":
            return None
        return self.host.join_line()

    @property
    def events_path(self) -> Path:
        return self.files.events

    def start(self) -> None:
        """Create the run directory, bind the collector and launch the ranks.

        Raises :class:`RunDirError` (one line) when the run directory cannot be written.
        """
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.files.config, self.cfg.to_json_dict())
            self._events_file = open(self.events_path, "ab")
        except OSError as exc:
            raise RunDirError(os_error_message(Path(exc.filename or self.run_dir), exc)) from None
        self.collector = Collector(self.cfg.run_id, world_size=self.cfg.world_size)
        self.stats = self.collector.stats
        if self.cfg.multinode:
            self.launcher = self._start_host()
        else:
            self.launcher = make_launcher(self.cfg, self.collector.endpoint)
        self.state.started_at = self.clock()
        self.launcher.start()

    def _start_host(self) -> Launcher:
        """Node 0 of a multi-node run: the join service and the CURVE inbox, then this node's
        ranks (slot 0) under c10d, or, under Slurm, srun starting one agent per node."""
        from ddptui.cluster.host import NodeHost

        assert self.collector is not None
        try:
            self.host = NodeHost(self.cfg)
        except (OSError, Exception) as exc:  # zmq.ZMQError: the address cannot be bound
            raise RunDirError(
                f"cannot host the run's telemetry on {self.cfg.bind}: {exc}"
            ) from None
        self.host.inbox.stats = self.collector.stats  # one count of what arrived
        if self.cfg.launcher == "slurm":
            from ddptui.cluster.slurm import SrunLauncher

            return SrunLauncher(self.cfg, self.host.token().encode())
        assert self.cfg.rdzv_endpoint is not None
        from ddptui.cluster.addresses import route_address, split_endpoint

        rendezvous = Rendezvous(
            self.cfg.nnodes,
            0,
            self.cfg.rdzv_endpoint,
            self.cfg.run_id,
            is_host=True,
            local_addr=route_address(split_endpoint(self.cfg.rdzv_endpoint)[0]),
        )
        return make_launcher(self.cfg, self.collector.endpoint, rendezvous)

    def pump(self, timeout: float = 0.1) -> list[protocol.AnyEvent]:
        """Receive, persist and apply what has arrived (waiting up to ``timeout``)."""
        if self.collector is None or self.fault is not None:
            time.sleep(timeout)
            return []
        events = self.collector.poll(timeout)
        remote: list[protocol.AnyEvent] = []
        if self.host is not None and self.host.inbox is not None:
            remote = self.host.inbox.poll(0.0)
            events += remote
        if events:
            self._record(events)
        for event in remote:
            if isinstance(event, protocol.Status) and event.state == "failed":
                self._on_remote_failure(event)
        return events

    def _on_remote_failure(self, event: protocol.Status) -> None:
        """A rank on another node failed: name it, and tear this node down (c10d would too,
        but only once a collective notices)."""
        if self.remote_failure is not None:
            return
        self.remote_failure = RankFailureInfo(
            rank=event.rank, error=event.error, traceback=event.traceback
        )
        if self.launcher is not None and self.result is None and not self._concluding:
            self._conclude(self.launcher.stop())

    def _placed(self, failure: RankFailureInfo) -> RankFailureInfo:
        """A multi-node run's failure of a rank here, naming its node and host."""
        view = self.state.ranks.get(failure.rank) if failure.rank is not None else None
        if view is None:
            return failure
        node = view.node if view.node is not None else "?"
        where = f"node {node} (host {view.host or '?'})"
        return dataclasses.replace(
            failure, error=f"{where}: {failure.error}" if failure.error else where
        )

    def _record(self, events: list[protocol.AnyEvent]) -> None:
        if self._events_file is not None:
            try:
                self._events_file.write(b"".join(protocol.to_json(e) + b"\n" for e in events))
                self._events_file.flush()
            except OSError as exc:
                self._fail_run_dir(exc)
        now = self.clock()
        with self._lock:
            for event in events:
                self.state.apply(event, now)

    def _fail_run_dir(self, exc: OSError) -> None:
        """The run directory broke: keep what is on disk, stop every worker, say why."""
        self.fault = os_error_message(self.events_path, exc)
        broken, self._events_file = self._events_file, None
        try:
            broken.close()
        except OSError:
            pass  # what could not be flushed is lost; what was written stays
        if self.launcher is not None and self.result is None:
            self._conclude(self.launcher.stop(), drain=False)

    def poll(self) -> LaunchResult | None:
        """The launcher's result once the run has ended (after draining late events)."""
        if self.result is not None or self.launcher is None:
            return self.result
        result = self.launcher.poll()
        if result is not None:
            self._conclude(result)
        return self.result

    def stop(self, interrupted: bool = False, exit_code: int | None = None) -> LaunchResult | None:
        """Stop every worker (SIGTERM, grace, SIGKILL). The run ends as ``stopped`` (the user
        asked) or ``interrupted`` (Ctrl-C / SIGTERM to ddptui, with ``exit_code``)."""
        self._interrupted = self._interrupted or interrupted
        if exit_code is not None:
            self._exit_code = exit_code
        if self.result is None and self.launcher is not None:
            self._conclude(self.launcher.stop())
        return self.result

    def _conclude(self, result: LaunchResult, drain: bool = True) -> None:
        self._concluding = True
        deadline = time.monotonic() + (DRAIN_SECONDS if drain else 0.0)
        while time.monotonic() < deadline and self.collector is not None:
            if not self.pump(0.05) and time.monotonic() > deadline - DRAIN_SECONDS / 2:
                break
        if drain and self.host is not None and result.failure is not None:
            # This node's rank may only have followed a rank that died on another node (a
            # collective lost its peer): give that node's report a moment to arrive.
            deadline = time.monotonic() + REMOTE_FAILURE_WAIT_S
            while self.remote_failure is None and time.monotonic() < deadline:
                self.pump(0.05)
        failure = result.failure
        remote = self.remote_failure is not None and not self._interrupted
        if remote and (failure is None or failure.signal is None):  # a kill here is its own cause
            failure = self.remote_failure  # another node failed first; this one followed
        elif self.host is not None and failure is not None:
            failure = self._placed(failure)
        if self.fault is not None and failure is None:
            failure = RankFailureInfo(rank=None, error=self.fault)
        outcome = decide_outcome(
            failed=remote or self.fault is not None or not (result.ok or result.stopped),
            stopped=result.stopped and self.fault is None and not remote,
            interrupted=self._interrupted,
        )
        with self._lock:
            self.state.set_outcome(outcome, failure, now=self.clock())
        self.result = result
        if self.host is not None:
            self.host.set_outcome(outcome, failure.describe() if failure else None)

    @property
    def outcome(self) -> str | None:
        return self.state.outcome

    @property
    def exit_code(self) -> int:
        """ddptui's exit code for this run (0 finished, 1 failed, 130 stopped/interrupted)."""
        if self._exit_code is not None and self.state.outcome == "interrupted":
            return self._exit_code
        return EXIT_CODES.get(self.state.outcome or "", 1)

    def close(self) -> None:
        """Stop anything still running, release the socket and files, write summary.json."""
        if self.launcher is not None and self.result is None:
            self.stop(interrupted=True)
        if self.host is not None:
            self.host.close()
            self.host = None
        if self.collector is not None:
            self.collector.close()
            self.collector = None
        if self._events_file is not None:
            try:
                self._events_file.close()
            except OSError as exc:
                self.fault = self.fault or os_error_message(self.events_path, exc)
            self._events_file = None
        if self.launcher is not None and self.summary is None:
            self._write_summary()

    def _write_summary(self) -> None:
        state = self.state
        duration = None
        if state.started_at is not None:
            duration = (state.finished_at or self.clock()) - state.started_at
        stats = self.stats
        self.summary = summarize(
            state,
            state.outcome or "interrupted",
            state.failure,
            exit_code=self.exit_code,
            events={
                "received": stats.received,
                "rejected": stats.rejected,
                "dropped": state.dropped,
            },
            duration_s=duration,
        )
        try:
            write_summary(self.run_dir, self.summary)
        except OSError as exc:
            self.fault = self.fault or os_error_message(self.files.summary, exc)

    def __enter__(self) -> RunSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def locked(self) -> threading.RLock:
        """Hold while reading ``state`` from a thread other than the one pumping."""
        return self._lock
