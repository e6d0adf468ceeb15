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

import contextlib
import dataclasses
import errno
import os
import shlex
import shutil
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ddptui import protocol, safeio
from ddptui.argv import config_script_epochs
from ddptui.constants import ATTEMPT_ENV, RESTART_COUNT_ENV, RESUME_ENV, STOP_SIGNAL
from ddptui.formatting import raised_in
from ddptui.rank import flight_recorder
from ddptui.rank.stacks import capture_stacks
from ddptui.run import flight
from ddptui.run.check_files import check_restart_checkpoint
from ddptui.run.cluster.addresses import route_address, split_endpoint
from ddptui.run.collector import Collector, CollectorStats
from ddptui.run.diagnosis import (
    GROWTH_NOTE_BYTES_S,
    RECENT_CPU_S,
    Diagnoser,
    Diagnosis,
    GrowthWatch,
    completed_anywhere,
    crash_cause,
    diagnose_crash,
    diagnoses_for_summary,
    growth_diagnosis,
    lingering_diagnosis,
    local_rank_hint,
    local_rank_read_hint,
    own_error_diagnosis,
    rank_ends,
    rank_wait_marks,
    spawner_hint,
)
from ddptui.run.launcher import Launcher, LaunchResult, Rendezvous
from ddptui.run.options import RunConfig
from ddptui.run.probe import RankProbe
from ddptui.run.quiet_gc import quiet_collector
from ddptui.run.rundir import (
    EXIT_CODES,
    RunDirError,
    decide_outcome,
    summarize,
    tail_lines,
    write_summary,
)
from ddptui.run.signals import signals_deferred
from ddptui.run.state import AttemptRecord, RankFailureInfo, RunState
from ddptui.runfiles import RunDir, write_json_atomic, write_private

#: After the launcher ends, keep reading this long for events still in flight.
DRAIN_SECONDS = 0.5
#: How often the running diagnosis (stragglers, hangs) looks at the run.
DIAGNOSE_EVERY_S = 1.0
#: Every rank finished this long ago and the launcher still runs: name what still runs.
LINGER_S = 30.0
#: How long to wait for the ranks' stack dumps after a hang.
STACKS_TIMEOUT_S = 5.0
#: How long a rank's trace socket may take to write its stacks before it is signalled.
STACKS_ASK_S = 1.0
#: Every rank still for this long inside a collective: ask for the traces (a desync?).
FLIGHT_WATCH_S = 1.0
#: A failed multi-node run: how long the other nodes have to send their ranks' traces.
CRASH_TRACES_S = 3.0
#: A rank still this long: load torch's analyzer in the background (a verdict may be near).
FLIGHT_WARM_S = 1.0
#: ...at most this often: a healthy run whose collectives are long (a slow network, a big
#: model) must not pay a trace dump (about a second of a rank's CPU) on every one.
FLIGHT_WATCH_EVERY_S = 30.0
#: After a stop with a checkpoint was asked: this long without any event from the ranks and
#: the front ends fall back to tearing the run down.
STOP_PATIENCE_S = 30.0

#: A multi-node run whose ranks here failed waits this long for another node's report of
#: the rank that failed first.
REMOTE_FAILURE_WAIT_S = 2.0


def local_pids(state: RunState, host: str) -> dict[int, int]:
    """The pids of the live ranks running on ``host`` (rank -> pid): the ones whose CPU this
    machine can sample. A rank on another node has a pid that means nothing here, or worse,
    another process's."""
    return {
        rank: view.pid
        for rank, view in state.ranks.items()
        if view.pid and view.state == "started" and view.host in (None, host)
    }


def make_launcher(
    cfg: RunConfig,
    endpoint: str | None,
    attempt: int = 0,
    resume: str | None = None,
    *,
    rendezvous: Rendezvous | None = None,
) -> Launcher:
    """The launcher of this machine's ranks for attempt ``attempt`` (0 first); a multi-node
    run's node ``rendezvous.node_rank`` runs its ``nproc_per_node`` ranks under torchrun's c10d
    rendezvous. A restarted attempt's ranks are told their attempt number (``DDPTUI_ATTEMPT``
    and torchrun's ``TORCHELASTIC_RESTART_COUNT``) and, when there is one, the checkpoint to
    resume from: a built-in trainer as ``--resume``, a user script as ``DDPTUI_RESUME``."""
    env = cfg.rank_environment()
    if attempt == 0 and cfg.script and cfg.resume:
        env[RESUME_ENV] = cfg.resume  # a script's --resume: the same convention
    if attempt > 0:
        env[ATTEMPT_ENV] = env[RESTART_COUNT_ENV] = str(attempt)
        if resume is not None:
            env[RESUME_ENV] = resume
            if not cfg.script:
                cfg = dataclasses.replace(cfg, resume=resume)
    return Launcher(
        "torchrun" if rendezvous is not None else cfg.launcher,
        cfg.nproc_per_node if rendezvous is not None else cfg.world_size,
        cfg.run_dir or ".",
        cfg.run_id,
        endpoint,
        module=None if cfg.script else cfg.trainer_module,
        script=cfg.script,
        args=cfg.trainer_argv(),
        env=env,
        rendezvous=rendezvous,
        script_module=cfg.script_module,
    )


def failure_key(failure: RankFailureInfo | None) -> tuple:
    """What makes two failures "the same": rank, exit code, signal and the error's first
    line."""
    if failure is None:
        return (None,)
    error = (failure.error or "").strip().splitlines()
    return (failure.rank, failure.exit_code, failure.signal, error[0] if error else "")


def checkpoint_identity(path: str | None) -> tuple | None:
    """A checkpoint file as it is now (path, size, mtime): a rewrite is another checkpoint."""
    if path is None:
        return None
    try:
        stat = os.stat(path)
    except OSError:
        return (path,)
    return (path, stat.st_size, stat.st_mtime_ns)


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
        self.state = RunState(
            cfg.run_id,
            cfg.world_size,
            epochs=cfg.epochs,
            script_epochs=config_script_epochs(cfg.to_json_dict()),
        )
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
        #: Stragglers, hangs and crash causes, found as the run goes (see ddptui.run.diagnosis).
        self.diagnoser = Diagnoser(hang_timeout=getattr(cfg, "hang_timeout", None))
        #: What to do when the run hangs: ``stop`` it (exit code 3) or ``keep`` it running.
        self.on_hang = getattr(cfg, "on_hang", "stop")
        #: Every rank's Python stack (rank -> text), captured when the run hung.
        self.stacks: dict[int, str] = {}
        self._beat_steps: dict[int, int] = {}  # rank -> steps at its last beat
        self.probe = None
        self._news: list[Diagnosis] = []
        self._next_diagnosis = 0.0
        #: How fast events.jsonl grows (said once, when fast: see :meth:`_watch_growth`).
        self._growth: GrowthWatch | None = GrowthWatch()
        self._lingering_said = False  # see _watch_lingering
        #: ddptui's own error in applying an event or in diagnosing the run (a bug of its
        #: own, or an event no check foresaw): said once; the diagnosis stays off after it.
        self._own_errors: set[str] = set()
        self._finished_at: float | None = None  # when it first saw every rank finished
        self._hung = False
        self._warmed = False  # torch's analyzer is loading (see _flight_warm)
        #: The traces ddptui asked for while the run went on (rank -> flight.Stamp): not
        #: what a rank left when the run crashed later (see flight.at_crash).
        self._asked_traces: dict[int, flight.Stamp] = {}
        self.state.max_restarts = cfg.max_restarts
        #: One line per restart (and per restart refused), for the front ends to show.
        self.restart_lines: list[str] = []
        #: Why the run was not restarted although restarts were left (one line), or None.
        self.restart_refused: str | None = None
        #: Per attempt: (identity of the checkpoint it started from, its failure's key).
        self._attempt_failures: list[tuple[tuple | None, tuple]] = []
        self._attempt_checkpoint: tuple | None = checkpoint_identity(cfg.resume)
        #: When a stop with a checkpoint was asked (clock time), or None.
        self.checkpoint_stop_at: float | None = None
        #: A multi-node run's node 0 side (keys, join service, CURVE inbox), or None.
        self.host = None
        #: ``ddptui join RUN_DIR``, once node 0 has written the run's join-token file there.
        self._join_shared: str | None = None
        #: The first failure another node reported (it tears this node down too).
        self.remote_failure: RankFailureInfo | None = None
        self._concluding = False
        #: The private directory of the ranks' Flight Recorder sockets (None: recorder off).
        self.fr_dir: Path | None = None
        #: What the last Flight Recorder check read (one line), or None.
        self.flight_note: str | None = None
        self._flight_asked: tuple | None = None  # the waits the last live check was about
        self._flight_next = 0.0  # when the next watch request may go
        #: The run directory was deleted while the run was live (nothing more is written).
        self.run_dir_deleted = False

    @property
    def join_line(self) -> str | None:
        """A multi-node run started by hand: the ``ddptui join …`` command every other node
        runs (it holds the run's client secret: show it to the user, never log it)."""
        if not self._hosting_by_hand:
            return None
        return self.host.join_line()

    @property
    def _hosting_by_hand(self) -> bool:
        """Node 0 of a multi-node run whose other nodes are started by hand (not by srun)."""
        return self.host is not None and self.cfg.launcher != "slurm"

    @property
    def nodes_to_join(self) -> int | None:
        """How many of the nodes a multi-node run waits for have not joined yet (None: not
        node 0 of a run started by hand)."""
        if not self._hosting_by_hand:
            return None
        book = self.host.book
        with book.lock:
            return sum(1 for slot in book.slots if slot not in book.joined)

    @property
    def join_shared_line(self) -> str | None:
        """The short form of :attr:`join_line` where this run directory is on a file system
        the other nodes share: ``ddptui join RUN_DIR`` reads the token there (``join-token``,
        the owner's only). None when the file could not be written."""
        return self._join_shared if self._hosting_by_hand else None

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
            self._events_file = safeio.LineAppender(self.events_path)  # whole lines or none
        except OSError as exc:
            raise RunDirError(os_error_message(Path(exc.filename or self.run_dir), exc)) from None
        self.collector = self._new_collector()
        self.stats = self.collector.stats
        if getattr(self.cfg, "flight_recorder", True):
            try:
                self.fr_dir = flight.make_socket_dir()
            except OSError:
                self.fr_dir = None  # the run goes on; hangs are judged without traces
        self.launcher = self._new_launcher()
        self._arm_flight(self.launcher)
        self.state.started_at = self.clock()
        self.state.begin_attempt(
            AttemptRecord(0, time.time(), resumed_from=self.cfg.resume or None)
        )
        self.launcher.start()
        quiet_collector()

    def _new_collector(self) -> Collector:
        """The socket the ranks send to (a benchmark's feeder may take another transport)."""
        return Collector(self.cfg.run_id, world_size=self.cfg.world_size)

    def _new_launcher(self) -> Launcher:
        """What starts the ranks: this node's part of a multi-node run, or the launcher
        (benchmarks put simulated senders here, and start as a run starts)."""
        assert self.collector is not None
        if self.cfg.multinode:
            return self._start_host()
        return make_launcher(self.cfg, self.collector.endpoint)

    def _open_host(self) -> None:
        """Node 0's side of a multi-node run: the keys, the join service and the CURVE inbox
        (benchmarks open it for the nodes they simulate)."""
        assert self.collector is not None
        # CURVE and the join service (part of 14 ms of imports): only a multi-node run
        from ddptui.run.cluster.host import NodeHost

        try:
            self.host = NodeHost(self.cfg)
        except (OSError, Exception) as exc:  # zmq.ZMQError: the address cannot be bound
            raise RunDirError(
                f"cannot host the run's telemetry on {self.cfg.bind}: {exc}"
            ) from None
        self.host.inbox.stats = self.collector.stats  # one count of what arrived
        try:  # for `ddptui join RUN_DIR` where the run directory is shared; only the owner's
            write_private(self.files.join_token, self.host.token().encode() + "\n")
        except OSError:
            pass  # the join line still says the token itself
        else:  # known once here, not asked of the file system at every refresh
            self._join_shared = f"ddptui join {shlex.quote(str(self.run_dir.resolve()))}"

    def _start_host(self) -> Launcher:
        """Node 0 of a multi-node run: the join service and the CURVE inbox, then this node's
        ranks (slot 0) under c10d, or, under Slurm, srun starting one agent per node."""
        # srun (part of 14 ms of imports): only a multi-node run needs it
        from ddptui.run.cluster.slurm import SrunLauncher

        self._open_host()
        assert self.host is not None
        if self.cfg.launcher == "slurm":
            return SrunLauncher(self.cfg, self.host.token().encode())
        assert self.cfg.rdzv_endpoint is not None
        rendezvous = Rendezvous(
            self.cfg.nnodes,
            0,
            self.cfg.rdzv_endpoint,
            self.cfg.run_id,
            is_host=True,
            local_addr=route_address(split_endpoint(self.cfg.rdzv_endpoint)[0]),
        )
        return make_launcher(self.cfg, self.collector.endpoint, rendezvous=rendezvous)

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
        if self.result is None and "diagnosis" not in self._own_errors:
            try:
                self._diagnose()
            except Exception as exc:  # noqa: BLE001 - ddptui's bug must not end the run
                self._own_error("diagnosis", exc)
        return events

    def _own_error(self, what: str, exc: BaseException) -> None:
        """ddptui's own code raised while ``what`` (``diagnosis``, ``events``): said once as
        a note (its error and where it was raised), never passed on. Before, it left the
        loop that drives the run, and the run was stopped: a monitor's bug ended a healthy
        run. The events are on disk already; after a diagnosis error no verdict is made
        again (no stop on a hang), as with ``--hang-timeout 0``."""
        if what in self._own_errors:
            return
        self._own_errors.add(what)
        found = own_error_diagnosis(what, exc, self.state.elapsed(self.clock()))
        with self._lock:
            self.diagnoser.record(found)
            self._news.append(found)

    # -- diagnosis ---------------------------------------------------------------------------
    def take_diagnoses(self) -> list[Diagnosis]:
        """What the diagnosis found since the last call (for the front end to show)."""
        with self._lock:
            news, self._news = self._news, []
        return news

    def _diagnose(self) -> None:
        now = self.clock()
        if now < self._next_diagnosis or self._concluding:
            return
        self._next_diagnosis = now + DIAGNOSE_EVERY_S
        if self.probe is None:
            self.probe = RankProbe()
        with self._lock:
            pids = local_pids(self.state, socket.gethostname())
        self.probe.sample(pids, now)
        self._watch_growth(now)
        self._watch_lingering(now)
        io_rates = self.probe.io_rate(RECENT_CPU_S)
        with self._lock:
            self.state.io_rates = io_rates
            found = self.diagnoser.check(
                self.state,
                now,
                self.probe.cpu_percent(),
                self.probe.cpu_percent(RECENT_CPU_S),
                io_rates,
            )
            self._news += found
        if self.diagnoser.hang is not None and not self._hung:
            self._on_hang(now)
        elif not self._hung:
            self._flight_warm()
            self._flight_watch(now)

    def _watch_growth(self, now: float) -> None:
        """Say once when events.jsonl grows so fast that the disk may fill: a run of very fast
        steps writes megabytes a second, and a full disk stops the run."""
        if self._growth is None or self._events_file is None:
            return
        rate = self._growth.sample(now, self._events_file.size)
        if rate is None or rate < GROWTH_NOTE_BYTES_S:
            return
        self._growth = None  # said once
        try:
            free: int | None = shutil.disk_usage(self.run_dir).free
        except OSError:
            free = None
        with self._lock:
            found = growth_diagnosis(rate, free, self.state.elapsed(now))
            self.diagnoser.record(found)
            self._news.append(found)

    def _watch_lingering(self, now: float) -> None:
        """Say once when every rank finished :data:`LINGER_S` ago and the launcher still runs,
        naming the run's processes still running (:func:`lingering_diagnosis`)."""
        launcher = self.launcher
        if self._lingering_said or not getattr(launcher, "running", False):
            return  # (a launcher of the benchmarks' own says nothing of it)
        with self._lock:
            state = self.state
            views = list(state.ranks.values())
            ended = len(views) >= state.world_size and all(v.state == "finished" for v in views)
        if not ended:
            self._finished_at = None
            return
        # From when this check first saw them all finished, not from their last events: the
        # process that started a rank's worker may beat on under its rank while it waits
        # for its other workers (ijepa's launched copy, in its join).
        if self._finished_at is None:
            self._finished_at = now
        since = now - self._finished_at
        if since < LINGER_S:
            return
        self._lingering_said = True
        with self._lock:  # a launched copy that started its own ranks, one of several a node
            hint = self._spawner_hint()
        found = lingering_diagnosis(
            state.world_size, since, launcher.still_running(), state.elapsed(now), hint
        )
        if found is not None:
            with self._lock:
                self.diagnoser.record(found)
                self._news.append(found)

    def _spawner_hint(self) -> str | None:
        """:func:`spawner_hint` for this run: its launched copies a node."""
        return spawner_hint(self.state.spawners, self.cfg.world_size // max(1, self.cfg.nnodes))

    def _arm_flight(self, launcher: Launcher) -> None:
        """Tell the ranks where to listen for Flight Recorder trace requests."""
        if self.fr_dir is not None and hasattr(launcher, "extra_env"):
            launcher.extra_env[flight_recorder.SOCKET_DIR_ENV] = str(self.fr_dir)

    def flight_check(self, now: float | None = None, record: bool = True) -> list[Diagnosis]:
        """Ask every live rank for its Flight Recorder trace and name the rank and collective
        that do not match (hang: never entered; desync: other arguments). Blocks up to
        :data:`ddptui.run.flight.REQUEST_TIMEOUT_S`; safe from any thread. ``record``: keep the
        findings as diagnoses (a verdict); else only return them (the user asked)."""
        if self.fr_dir is None:
            self.flight_note = "Flight Recorder off (--no-flight-recorder)"
            return []
        now = self.clock() if now is None else now
        with self._lock:
            live = {r: v for r, v in self.state.ranks.items() if v.state == "started"}
            t = self.state.elapsed(now)
            stacks = dict(self.stacks)
            frames = {r: v.frame for r, v in live.items() if v.frame}
        remote: list[int] = []
        if self.host is not None:  # ranks under a joined node's agent: it fetches theirs
            with self.host.book.lock:
                joined = set(self.host.book.joined)
            remote = [r for r, v in live.items() if v.node is not None and v.node in joined]
        stamps: dict[int, flight.Stamp] = {}
        found, note = flight.collect(
            self.fr_dir,
            self.run_dir,
            list(live),
            self.state.world_size,  # the world a script's own workers grew it to
            t,
            stacks=stacks,
            remote=remote,
            fetch=self.host.fetch_traces if self.host is not None else None,
            frames=frames,
            stamps=stamps,
        )
        with self._lock:
            self._asked_traces.update(stamps)
            self.flight_note = note
            if record:
                for diagnosis in found:
                    self.diagnoser.record(diagnosis)
                self._news += found
        return found

    def _flight_warm(self) -> None:
        """Once any live rank has stood still for :data:`FLIGHT_WARM_S`, or a rank has failed
        and left its trace, load torch's analyzer in the background: a hang verdict, or the
        crash diagnosis once the launcher ends, then reads the traces without waiting for
        torch to load in this process (a killed rank's run, alone on a slow machine: 3.3 s
        from the launcher's end to the summary when the import began only then, 1.7 s since).
        A failed rank that left no trace (it failed before its group formed: a script's
        argument parser, an import) gives the analyzer nothing to read: torch is not loaded
        for it (3.3 s of CPU on a slow machine)."""
        if self.fr_dir is None or self._warmed:
            return
        with self._lock:
            still = failed = False
            for view in self.state.ranks.values():
                if view.state == "failed":
                    failed = True
                elif view.state == "started" and (view.still_for or 0.0) >= FLIGHT_WARM_S:
                    still = True
                    break
        if still or (failed and self.files.has_traces()):
            self._warmed = True
            flight.warm_analyzer()

    def _flight_watch(self, now: float) -> None:
        """Before any timeout: when every live rank has stood still for a beat inside a
        collective (its heartbeat's Flight Recorder progress), ask for the traces once; a
        desync torch's analyzer finds (another op, shape or dtype at the same number) is
        evidence enough to give the verdict (and, with ``--on-hang stop``, end the run)."""
        if self.fr_dir is None:
            return
        with self._lock:
            live = {r: v for r, v in self.state.ranks.items() if v.state == "started"}
            done = completed_anywhere(self.state)  # a mark another rank completed is stale
            waits = []
            for rank, view in sorted(live.items()):
                inside = rank_wait_marks(view, done)  # gloo's marks lag: moco's were asked
                if not inside or (view.still_for or 0.0) < FLIGHT_WATCH_S:
                    return
                waits.append((rank, inside))
        key = tuple(waits)
        if len(waits) < 2 or key == self._flight_asked or now < self._flight_next:
            return
        self._flight_asked = key
        self._flight_next = now + FLIGHT_WATCH_EVERY_S
        desync = [d for d in self.flight_check(now, record=False) if d.cause == "desync"]
        if not desync:
            return
        with self._lock:
            for diagnosis in desync:
                self.diagnoser.record(diagnosis)
            self._news += desync
        if self.on_hang != "keep" and self.launcher is not None and self.result is None:
            self._hung = True  # (kept running: a later hang still gets its stacks)
            self._conclude(self.launcher.stop(), hung=True)

    def _on_hang(self, now: float) -> None:
        """Capture every rank's stack, name the culprit, then stop the run (or keep it)."""
        self._hung = True
        with self._lock:
            pids = {r: v.pid for r, v in self.state.ranks.items() if v.pid}
        stacks = capture_stacks(
            pids, self.run_dir, STACKS_TIMEOUT_S, run_id=self.cfg.run_id, ask=self._ask_stacks
        )
        with self._lock:
            self.stacks = stacks
            no_ddp = {r for r, v in self.state.ranks.items() if v.no_ddp}
            self._news += self.diagnoser.explain_hang(stacks, self.state.elapsed(now), no_ddp)
        self.flight_check(now)
        if self.on_hang != "keep" and self.launcher is not None and self.result is None:
            self._conclude(self.launcher.stop(), hung=True)

    def _ask_stacks(self, ranks: list[int]) -> set[int]:
        """The ranks that wrote their stacks when asked over their trace socket (from a thread
        holding the GIL: see :mod:`ddptui.rank.stacks`); the others are signalled."""
        if self.fr_dir is None:
            return set()
        answers = flight.request_traces(
            self.fr_dir, ranks, STACKS_ASK_S, flight_recorder.STACKS_REQUEST
        )
        return {rank for rank, answer in answers.items() if answer == "ok"}

    def _diagnose_crash(self) -> None:
        state = self.state
        failure = state.failure
        memory = self.probe.memory_state() if self.probe is not None else None
        rss = self.probe.rss if self.probe is not None else None
        traced: list[Diagnosis] = []
        if self.fr_dir is not None:  # the collective each rank was in, from its trace
            pids = {r: v.pid for r, v in state.ranks.items()}
            failed = [r for r, v in state.ranks.items() if v.state == "failed"]
            if failure is not None and failure.rank is not None and not failure.spawner:
                failed.append(failure.rank)
            errors = {r: v.error for r, v in state.ranks.items() if v.error}
            tracebacks = {r: v.traceback for r, v in state.ranks.items() if v.traceback}
            traced = flight.at_crash(
                self.run_dir,
                pids,
                state.world_size,  # the world a script's own workers grew it to
                state.elapsed(self.clock()),
                failed,
                errors,
                (failure.rank, failure.stderr_tail) if failure is not None else None,
                asked=dict(self._asked_traces),
                tracebacks=tracebacks,
            )
        # A desync torch's analyzer names is the cause; the failures it set off come after.
        desync = next((d for d in traced if d.cause == "desync" and d.rank is not None), None)
        found = diagnose_crash(
            rank_ends(state),
            failure.rank if failure is not None and not failure.spawner else None,
            memory,
            rss,
            t=state.elapsed(self.clock()),
            desync=(desync.rank, flight.collective_named(desync.detail)) if desync else None,
        )
        found = [*traced, *found] if desync else [*found, *traced]
        # A hint goes on the headline crash, or on the failed rank whose log it is from.
        hint, on = None, next((d.rank for d in found if d.cause == "crash"), None)
        if failure is not None and not self.cfg.local_rank_arg and self.cfg.trainer_module is None:
            hint = local_rank_hint(failure.stderr_tail)
            if hint:
                on = failure.rank
            else:  # a rank's local-rank option torchrun left at its default
                hint = local_rank_read_hint(state.local_rank_reads, failure.rank)
        if not hint:  # a launched copy started its own ranks, one of several a node
            hint = self._spawner_hint()
        if hint:
            found = [
                dataclasses.replace(d, detail=f"{d.detail}; {hint}")
                if d.cause == "crash" and d.rank == on
                else d
                for d in found
            ]
        for diagnosis in found:
            self.diagnoser.record(diagnosis)
        self._news += found

    def _fetch_remote_traces(self) -> None:
        """A failed multi-node run: bring the traces of the ranks on the other nodes (those
        still running and those a failed rank left) into the run directory, for
        :func:`ddptui.run.flight.at_crash` (their agents answer before the outcome ends them)."""
        if self.host is None or self.fr_dir is None:
            return
        with self.host.book.lock:
            joined = set(self.host.book.joined)
        with self._lock:
            remote = [
                r for r, v in self.state.ranks.items() if v.node is not None and v.node in joined
            ]
        if remote:
            self.host.fetch_traces(remote, CRASH_TRACES_S)

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

    def _kept(self, event: protocol.AnyEvent) -> bool:
        """Whether ``event`` goes into events.jsonl: all but the heartbeats of a rank that
        stepped since its previous beat (those say nothing the steps do not; the beats of a
        rank preparing, evaluating or standing still are kept for replay)."""
        if type(event) is not protocol.Beat:
            return True
        previous = self._beat_steps.get(event.rank)
        self._beat_steps[event.rank] = event.steps
        return previous is None or previous == event.steps

    def _record(self, events: list[protocol.AnyEvent]) -> None:
        if self._events_file is not None:
            try:
                kept = [e for e in events if self._kept(e)]
                self._events_file.append(protocol.to_json_lines(kept))
            except OSError as exc:
                self._fail_run_dir(exc)
            else:
                self._check_run_dir()
        now = self.clock()
        failed: Exception | None = None
        with self._lock:
            for event in events:
                try:
                    self.state.apply(event, now)
                except Exception as exc:  # noqa: BLE001 - kept on disk; the others still count
                    failed = failed or exc
        if failed is not None:
            self._own_error("events", failed)

    def _rank_cause(self, failure: RankFailureInfo | None) -> RankFailureInfo | None:
        """A failure the launcher reports without a rank (its driver died too, say on a
        read-only run directory), or of the process it launched as a rank that its own workers
        took over (a script's mp.spawn: :attr:`RankFailureInfo.spawner`), when a rank reported
        its own error first: that rank's error, traceback and log are the cause to show, not
        the driver's traceback nor the spawner's exit code."""
        if failure is None or self.fault is not None:
            return failure
        if failure.error is None and failure.signal is None:
            # a process that died without saying why (a script's mp.spawn whose workers
            # failed before forming their group): the error its log ends with
            error = raised_in(failure.stderr_tail)
            if error is not None:
                failure = dataclasses.replace(failure, error=error)
        with self._lock:
            if failure.rank is not None:
                view = self.state.ranks.get(failure.rank)
                # its pid as it announced itself in this attempt (a pending one: not yet)
                mine = view.pid if view is not None and view.state != "pending" else None
                if failure.pid is None or mine is None or mine == failure.pid:
                    return failure
                failure = dataclasses.replace(failure, spawner=True)
            if failure.signal is not None:  # a kill is its own cause
                return failure
            return self._said_cause() or failure

    def _said_cause(self) -> RankFailureInfo | None:
        """Under the lock: the cause among the ranks that said why they failed (the launcher's
        record is not set yet), as the crash diagnosis picks it (a rank that failed on its
        lost peer, gloo's "Connection closed by peer" when mp.spawn's worker 1 raised, is
        not), with its error, traceback and log; None where no rank said it failed."""
        said = [end for end in rank_ends(self.state) if end.error]
        if not said:
            return None
        first = self.state.ranks[crash_cause(said).rank]
        return RankFailureInfo(
            rank=first.rank,
            error=first.error,
            traceback=getattr(first, "traceback", None),
            stderr_tail=tuple(tail_lines(self.files.rank_log(first.rank))),
        )

    def _check_run_dir(self) -> bool:
        """Whether the run directory is still there; when it was deleted (or replaced) under
        the live run, fail the run saying which files are gone. True while it is there."""
        if self._events_file is None or not self._events_file.deleted():
            return True
        gone = [
            path.name
            for path in (self.files.config, self.files.events)
            if not os.path.lexists(path)
        ]
        self.run_dir_deleted = True
        self._fail_run_dir(
            None,
            f"run directory {self.run_dir} was deleted while the run was live "
            f"({', '.join(gone) + ' gone' if gone else 'events.jsonl replaced'})",
        )
        if self.result is not None and self.state.outcome in ("finished", "stopped"):  # at the end
            with self._lock:
                self.state.set_outcome(
                    "failed", RankFailureInfo(rank=None, error=self.fault), now=self.clock()
                )
        return False

    def _fail_run_dir(self, exc: OSError | None, fault: str | None = None) -> None:
        """The run directory broke: keep what is on disk, stop every worker, say why."""
        self.fault = fault or os_error_message(self.events_path, exc)
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
        if result is not None and not self._restart(result):
            self._conclude(result)
        return self.result

    # -- restarts (--max-restarts) ----------------------------------------------------------
    @property
    def attempt(self) -> int:
        return self.state.attempt

    def _restart(self, result: LaunchResult) -> bool:
        """After a rank failed: relaunch the whole group when restarts are left and the
        checkpoint to resume from is sound; whether it did. The same failure twice from the
        same checkpoint is not restarted again."""
        if (
            self.cfg.max_restarts <= self.attempt
            or self.checkpoint_stop_at is not None
            or self.fault is not None
            or self._interrupted
            or result.stopped
            or result.ok
            or self.collector is None
        ):
            return False
        self._drain()
        failure = result.failure or RankFailureInfo(rank=None, exit_code=result.exit_code)
        view = self.state.ranks.get(failure.rank) if failure.rank is not None else None
        if view is not None and not failure.error and view.error:
            failure = dataclasses.replace(failure, error=view.error)
        with self._lock:
            self.state.end_attempt("failed", failure)
        key = failure_key(failure)
        started_from = self._attempt_checkpoint
        for number, (checkpoint, earlier) in enumerate(self._attempt_failures):
            if checkpoint == started_from and earlier == key:
                first = self.state.attempts[number].failure
                self._refuse(
                    f"the same failure twice from the same checkpoint: attempt {number + 1}: "
                    f"{first.describe(short=True) if first else '?'}; attempt {self.attempt + 1}: "
                    f"{failure.describe(short=True)}"
                )
                return False
        self._attempt_failures.append((started_from, key))
        resume, epoch = self._resume_point()
        if resume is not None:
            problem, epoch = check_restart_checkpoint(self.cfg, resume)
            if problem:
                self._refuse(problem)
                return False
        number = self.attempt + 1
        # A script keeps checkpoints of its own that ddptui does not know (torchtitan
        # loaded its step 15 and went on at 16, where this line said "from scratch").
        where = "the script starts again, from its own checkpoint if it keeps one"
        if not self.cfg.script:
            where = "from scratch"
        if resume is not None:
            where = f"resuming from {os.path.basename(resume)}"
            where += f" (epoch {epoch})" if epoch is not None else ""
        self.restart_lines.append(
            f"restart {number}/{self.cfg.max_restarts}: {failure.describe()}; {where}"
        )
        self._attempt_checkpoint = checkpoint_identity(resume)
        with self._lock:
            self.state.begin_attempt(
                AttemptRecord(number, time.time(), resumed_from=resume, resumed_from_epoch=epoch)
            )
        self.launcher = make_launcher(self.cfg, self.collector.endpoint, number, resume)
        self._arm_flight(self.launcher)
        with signals_deferred():  # no signal between start and remembering the process
            self.launcher.start()
        return True

    def _resume_point(self) -> tuple[str | None, int | None]:
        """The checkpoint a restart resumes from: the run's own (written by this run), else
        the run's ``--resume``, else none (from scratch)."""
        own = self.files.checkpoint
        if own.is_file():
            return str(own), None
        return self.cfg.resume or None, None

    def _refuse(self, line: str) -> None:
        self.restart_refused = line
        with self._lock:
            self.state.restart_refused = line

    # -- stop with a checkpoint ------------------------------------------------------------
    def can_stop_with_checkpoint(self) -> bool:
        """A built-in trainer's run whose every rank has said where it runs (its stop handler
        is installed by then) and that is still going."""
        with self._lock:
            views = list(self.state.ranks.values())
        return (
            not self.cfg.script
            and self.result is None
            and self.launcher is not None
            and bool(self.cfg.run_dir)
            and all(v.state == "started" and v.pid for v in views)
        )

    def stop_with_checkpoint(self) -> bool:
        """Ask every rank to stop after an agreed step with a checkpoint; whether it was
        asked (else stop with :meth:`stop`). The run then ends ``stopped``; see
        :meth:`stop_overdue` for when to give up waiting."""
        if not self.can_stop_with_checkpoint():
            return False
        assert self.launcher is not None
        with self._lock:
            pids = {v.pid for v in self.state.ranks.values() if v.pid}
        if not self.launcher.signal_ranks(pids, getattr(signal, STOP_SIGNAL)):
            return False
        self.checkpoint_stop_at = self.clock()
        return True

    def stop_overdue(self, now: float | None = None) -> bool:
        """A stop with a checkpoint was asked and no event came for STOP_PATIENCE_S since."""
        if self.checkpoint_stop_at is None or self.result is not None:
            return False
        now = self.clock() if now is None else now
        last = max(self.checkpoint_stop_at, self.state.last_event_at or 0.0)
        return now - last > STOP_PATIENCE_S

    def stop(self, interrupted: bool = False, exit_code: int | None = None) -> LaunchResult | None:
        """Stop every worker (SIGTERM, grace, SIGKILL). The run ends as ``stopped`` (the user
        asked) or ``interrupted`` (Ctrl-C / SIGTERM to ddptui, with ``exit_code``)."""
        self._interrupted = self._interrupted or interrupted
        if exit_code is not None:
            self._exit_code = exit_code
        if self.result is None and self.launcher is not None:
            self._conclude(self.launcher.stop())
        return self.result

    def _drain(self, seconds: float = DRAIN_SECONDS) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and self.collector is not None:
            if not self.pump(0.05) and time.monotonic() > deadline - DRAIN_SECONDS / 2:
                break

    def _conclude(self, result: LaunchResult, drain: bool = True, hung: bool = False) -> None:
        self._concluding = True  # no new diagnosis while draining the last events
        self._drain(DRAIN_SECONDS if drain else 0.0)
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
        failure = self._rank_cause(failure)
        asked = self.checkpoint_stop_at is not None and self.fault is None
        said = None
        if failure is None and result.ok and not (asked or hung or self._interrupted):
            # Every process ended well by the launcher's count, yet a rank said it failed: the
            # ranks are workers the script started and joined without a look at their exit
            # codes (the distributed tutorial's Process per rank), so the script exits 0.
            with self._lock:
                failure = said = self._said_cause()
        outcome = decide_outcome(
            failed=remote
            or self.fault is not None
            or not (result.ok or result.stopped)
            or said is not None,
            stopped=(result.stopped or (asked and result.ok)) and self.fault is None and not remote,
            interrupted=self._interrupted,
            hung=hung,
        )
        if hung:
            failure = None  # ddptui's own teardown of a hung run, not a rank's failure
        if outcome == "failed":
            self._fetch_remote_traces()
        with self._lock:
            cpu = self.probe.cpu_percent() if self.probe is not None else None
            self._news += self.diagnoser.final(self.state, self.clock(), cpu)
            self.state.set_outcome(outcome, failure, now=self.clock())
            if outcome == "failed":
                self._diagnose_crash()
            self.state.end_attempt(outcome, self.state.failure)
        self.result = result
        if self.host is not None:
            self.host.set_outcome(outcome, failure.describe() if failure else None)

    @property
    def outcome(self) -> str | None:
        return self.state.outcome

    @property
    def exit_code(self) -> int:
        """ddptui's exit code for this run (0 finished, 1 failed, 3 hung, 130 stopped or
        interrupted)."""
        if self._exit_code is not None and self.state.outcome == "interrupted":
            return self._exit_code
        return EXIT_CODES.get(self.state.outcome or "", 1)

    def close(self) -> None:
        """Stop anything still running, release the socket and files, write summary.json."""
        if self.launcher is not None and self.result is None:
            self.stop(interrupted=True)
        if self.host is not None:
            # srun has returned: every agent it started has ended, none is left to tell
            if self.cfg.launcher == "slurm" and self.result is not None:
                self.host.close(linger=0.0)
            else:
                self.host.close()
            self.host = None
            with contextlib.suppress(OSError):  # the run's secret, of no use once it ended
                self.files.join_token.unlink(missing_ok=True)
        if self.collector is not None:
            self.collector.close()
            self.collector = None
        flight.remove_socket_dir(self.fr_dir)
        if self._events_file is not None:
            self._check_run_dir()
        if self._events_file is not None:
            try:
                self._events_file.close()
            except OSError as exc:
                self.fault = self.fault or os_error_message(self.events_path, exc)
            self._events_file = None
        if self.launcher is not None and self.summary is None:
            self._write_summary()
        self._remove_empty_stack_files()

    def _remove_empty_stack_files(self) -> None:
        """Every rank opens its ``stacks-rank-N.txt`` at start (faulthandler needs the file
        then); one that no dump was written to says nothing and goes."""
        for rank in self.state.ranks:
            path = self.files.stacks(rank)
            try:
                if path.is_file() and not path.is_symlink() and path.stat().st_size == 0:
                    path.unlink()
            except OSError:
                continue

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
        self.summary.update(diagnoses_for_summary(self.diagnoser.diagnoses, self.stacks))
        if self.flight_note:  # what the last Flight Recorder check could read, and not
            self.summary["flight_recorder"] = self.flight_note
        if self.run_dir_deleted:  # writing it would recreate a directory holding only it
            return
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
