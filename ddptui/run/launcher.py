"""One launcher interface for both launchers: start, poll, stop.

The ranks run under a driver child process (``ddptui.run.drivers``) in its own session:
mp.spawn or torchrun. Teardown — on stop, Ctrl-C, or a rank's failure — sends SIGTERM to
every process of the run, then SIGKILL after a grace period. "Every process" is the driver's
process tree plus anything whose environment carries this run's ``DDPTUI_RUN_ID`` (torchrun
starts each worker in a session of its own, and an orphaned rank leaves the tree), looked for
again until none is left, so a rank that appears during teardown (still starting) is caught.

The driver is ddptui's child: only its ``Popen`` ever waits for it, so its real exit code is
kept, and it is signalled only while it is unreaped (its pid cannot have been reused). Any
other process is signalled only after checking it is still the process that was found (pid and
create time, through a pidfd where the kernel has them).

If ddptui itself dies, the driver and the ranks follow it (``ddptui.rank.entry.die_with_parent``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

from ddptui.argv import target_args
from ddptui.constants import (
    ENDPOINT_ENV,
    LAUNCHERS,
    NNODES_ENV,
    NODE_SLOT_ENV,
    PARENT_PID_ENV,
    RUN_DIR_ENV,
    RUN_ID_ENV,
)
from ddptui.run import prestart
from ddptui.run.rundir import read_failure, tail_lines
from ddptui.run.state import RankFailureInfo
from ddptui.runfiles import RunDir

#: How long teardown keeps looking for processes of the run after SIGKILL.
KILL_SWEEP_S = 5.0
_SWEEP_INTERVAL_S = 0.1


@dataclass(frozen=True)
class LaunchResult:
    """How the processes ended: the driver's exit code (negative: killed by that signal), and
    ``failure`` naming the first failing rank when there is one."""

    exit_code: int
    failure: RankFailureInfo | None = None
    stopped: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.stopped and self.failure is None


@dataclass(frozen=True)
class Rendezvous:
    """This node's part of a multi-node run: torchrun's c10d rendezvous at ``endpoint``
    (hosted by the node with ``is_host``), ``node_rank`` of ``nnodes`` (ddptui's slot; c10d
    assigns the group ranks itself)."""

    nnodes: int
    node_rank: int
    endpoint: str
    run_id: str
    is_host: bool
    #: The address this node's agent advertises to the others (torchrun's --local-addr).
    local_addr: str | None = None

    def driver_args(self) -> list[str]:
        local = ["--local-addr", self.local_addr] if self.local_addr else []
        return [
            *local,
            "--nnodes",
            str(self.nnodes),
            "--node-rank",
            str(self.node_rank),
            "--rdzv-endpoint",
            self.endpoint,
            "--rdzv-id",
            self.run_id,
            "--rdzv-host",
            "1" if self.is_host else "0",
        ]


@dataclass(frozen=True)
class ProcessIdentity:
    """One process, as found: its pid and its create time (a reused pid has another)."""

    pid: int
    create_time: float

    @classmethod
    def of(cls, proc: psutil.Process) -> ProcessIdentity | None:
        try:
            return cls(proc.pid, proc.create_time())
        except (psutil.Error, OSError):
            return None

    def _current(self) -> psutil.Process | None:
        """The process now at ``pid`` if it is this one, else None."""
        try:
            proc = psutil.Process(self.pid)
            return proc if proc.create_time() == self.create_time else None
        except (psutil.Error, OSError):
            return None

    def alive(self) -> bool:
        """Still running (a zombie has ended: it only waits for its parent)."""
        proc = self._current()
        try:
            return proc is not None and proc.status() != psutil.STATUS_ZOMBIE
        except (psutil.Error, OSError):
            return False

    def signal(self, sig: int) -> bool:
        """Send ``sig`` if the pid still belongs to this process; whether it was sent."""
        pidfd = None
        try:
            pidfd = os.pidfd_open(self.pid)
        except ProcessLookupError:
            return False
        except (OSError, AttributeError):  # pragma: no cover - no pidfd: check, then kill
            pidfd = None
        try:
            # The pidfd names whatever process held the pid when it was opened. If the pid
            # still belongs to the process we found (which existed before that), it is it.
            if self._current() is None:
                return False
            if pidfd is not None:
                signal.pidfd_send_signal(pidfd, sig)
            else:  # pragma: no cover
                os.kill(self.pid, sig)
            return True
        except (ProcessLookupError, PermissionError):
            return False
        finally:
            if pidfd is not None:
                os.close(pidfd)


class Launcher:
    """Runs ``world_size`` ranks of a trainer module or a user script under ``kind``."""

    def __init__(
        self,
        kind: str,
        world_size: int,
        run_dir: str | Path,
        run_id: str,
        endpoint: str | None,
        module: str | None = None,
        script: str | None = None,
        args: list[str] | tuple[str, ...] = (),
        grace: float = 3.0,
        env: Mapping[str, str] | None = None,
        rendezvous: Rendezvous | None = None,
        script_module: str | None = None,
    ) -> None:
        if kind not in LAUNCHERS:
            raise ValueError(f"unknown launcher {kind!r}")
        if (module is None) == (script is None):
            raise ValueError("give exactly one of module or script")
        self.kind = kind
        self.world_size = world_size
        self.run_dir = Path(run_dir)
        self.run_id = run_id
        self.endpoint = endpoint
        self.module = module
        self.script = script
        #: The user's module (``--module``; :attr:`script` is its file), run as ``python -m``.
        self.script_module = script_module if script is not None else None
        #: Extra environment for every rank (the run's device choice, say).
        self.extra_env = dict(env or {})
        self.args = list(args)
        self.grace = grace
        self.rendezvous = rendezvous
        if rendezvous is not None and kind != "torchrun":
            raise ValueError("a multi-node run starts its ranks under torchrun")
        self.process: subprocess.Popen[bytes] | None = None
        self.result: LaunchResult | None = None
        self._stopping = False

    def command(self) -> list[str]:
        return [sys.executable, "-m", "ddptui.run.drivers", *self.driver_args()]

    def driver_args(self) -> list[str]:
        """The driver's own command line (after ``python -m ddptui.run.drivers``)."""
        cmd = [
            self.kind,
            "--nprocs",
            str(self.world_size),
            "--run-dir",
            str(self.run_dir),
            "--result",
            str(RunDir(self.run_dir).result),
        ]
        if self.rendezvous is not None:
            cmd += self.rendezvous.driver_args()
        return [*cmd, *target_args(self.module, self.script, self.script_module), "--", *self.args]

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.extra_env)
        env[RUN_ID_ENV] = self.run_id
        env[RUN_DIR_ENV] = str(self.run_dir)
        env["PYTHONUNBUFFERED"] = "1"
        env[PARENT_PID_ENV] = str(os.getpid())  # the driver exits if it finds another parent
        if self.endpoint:
            env[ENDPOINT_ENV] = self.endpoint
        else:
            env.pop(ENDPOINT_ENV, None)
        env.pop(NNODES_ENV, None)
        env.pop(NODE_SLOT_ENV, None)
        if self.rendezvous is not None:
            env[NNODES_ENV] = str(self.rendezvous.nnodes)
            env[NODE_SLOT_ENV] = str(self.rendezvous.node_rank)
        return env

    def _node_slot(self) -> str | None:
        return str(self.rendezvous.node_rank) if self.rendezvous is not None else None

    # -- the interface ----------------------------------------------------------------------
    def start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        RunDir(self.run_dir).result.unlink(missing_ok=True)
        env = self.environment()
        if self.kind == "torchrun":
            # the driver the ddptui command started before loading the rest (first attempt)
            self.process = prestart.take(self.driver_args(), env, RunDir(self.run_dir).launcher_log)
            if self.process is not None:
                return
        with open(RunDir(self.run_dir).launcher_log, "ab") as log:
            self.process = subprocess.Popen(
                self.command(),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def running(self) -> bool:
        return self.process is not None and self.result is None and self.process.poll() is None

    def still_running(self) -> list[tuple[int, str]]:
        """The run's processes still running (not the driver, not zombies, not
        multiprocessing's resource trackers, which end with the processes they serve), as
        ``(pid, what)``: the script a process runs, or a ``multiprocessing`` child and its
        parent; by pid."""
        running = []
        for pid in sorted(self._run_processes()):
            try:
                proc = psutil.Process(pid)
                if proc.status() == psutil.STATUS_ZOMBIE:
                    continue
                words, parent = proc.cmdline(), proc.ppid()
                if not words:  # in its exec (no command line to read for a moment): its name
                    words = [proc.name()]
            except (psutil.Error, OSError):
                continue
            line = " ".join(words)
            if "multiprocessing.resource_tracker" in line or "forkserver" in line:
                continue
            if "multiprocessing.spawn" in line or "--multiprocessing-fork" in line:
                running.append((pid, f"a multiprocessing child of {parent}"))
                continue
            # the script it runs, else its program
            named = [Path(word).name for word in words[1:] if word.endswith(".py")] or [
                Path(word).name for word in words[:1]
            ]
            running.append((pid, named[0] if named else "?"))
        return running

    def poll(self) -> LaunchResult | None:
        """None while the run is going; its :class:`LaunchResult` once it has ended."""
        if self.result is not None:
            return self.result
        if self.process is None or self.process.poll() is None:
            return None
        self._kill_leftovers()
        self.result = self._result(self.process.returncode)
        return self.result

    def stop(self, grace: float | None = None) -> LaunchResult:
        """Tear the run down (SIGTERM, grace, SIGKILL); idempotent."""
        if self.result is not None:
            return self.result
        if self.process is None:
            self.result = LaunchResult(0, stopped=True)
            return self.result
        self._stopping = self.process.poll() is None
        self._terminate(self.grace if grace is None else grace)
        self.result = self._result(self.process.wait())
        return self.result

    def signal_ranks(self, pids: set[int], sig: int) -> bool:
        """Send ``sig`` to the processes ``pids`` (the ranks, as they said) that are processes
        of this run (checked by their environment); whether every one was signalled."""
        if not self.running:
            return False
        found = self._run_processes()
        targets = [found.get(pid) for pid in pids]
        if not targets or any(ident is None for ident in targets):
            return False
        return all(ident.signal(sig) for ident in targets if ident is not None)

    # -- internals ----------------------------------------------------------------------------
    def _driver_running(self) -> bool:
        """The driver has not been reaped: its pid (and process group id) are still its own."""
        return self.process is not None and self.process.poll() is None

    def _signal_driver(self, sig: int) -> None:
        """``sig`` to the driver and its process group (the mp.spawn ranks), while unreaped."""
        if not self._driver_running():
            return
        assert self.process is not None
        try:
            os.killpg(self.process.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        self.process.send_signal(sig)  # Popen checks the driver is unreaped first

    def _run_processes(self) -> dict[int, ProcessIdentity]:
        """Every process of the run except the driver: the driver's descendants (while the
        driver is unreaped) and any process carrying this run's id."""
        found: dict[int, ProcessIdentity] = {}
        if self._driver_running():
            assert self.process is not None
            try:
                children = psutil.Process(self.process.pid).children(recursive=True)
            except (psutil.Error, OSError):
                children = []
            for child in children:
                ident = ProcessIdentity.of(child)
                if ident is not None:
                    found[ident.pid] = ident
        skip = {os.getpid(), self.pid}
        for proc in psutil.process_iter(["pid"]):
            if proc.pid in found or proc.pid in skip:
                continue
            try:
                environ = proc.environ()
                # Nodes of one run may share a machine (tests): each tears down its own.
                if environ.get(RUN_ID_ENV) != self.run_id:
                    continue
                if environ.get(NODE_SLOT_ENV) != self._node_slot():
                    continue
            except (psutil.Error, OSError):
                continue
            ident = ProcessIdentity.of(proc)
            if ident is not None:
                found[ident.pid] = ident
        return found

    def _sweep(self, seen: dict[int, ProcessIdentity], sig: int) -> int:
        """Send ``sig`` to the processes of the run not in ``seen`` yet; add them; how many."""
        new = 0
        for pid, ident in self._run_processes().items():
            if seen.get(pid) != ident:
                seen[pid] = ident
                ident.signal(sig)
                new += 1
        return new

    def _terminate(self, grace: float) -> None:
        """SIGTERM to every process of the run, SIGKILL to what is left after ``grace``; keep
        looking for processes of the run (ranks still starting) until none is left."""
        seen: dict[int, ProcessIdentity] = {}
        self._signal_driver(signal.SIGTERM)
        self._sweep(seen, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            time.sleep(_SWEEP_INTERVAL_S)
            new = self._sweep(seen, signal.SIGTERM)
            if (
                not new
                and not self._driver_running()
                and not any(ident.alive() for ident in seen.values())
            ):
                return
        self._signal_driver(signal.SIGKILL)
        deadline = time.monotonic() + KILL_SWEEP_S
        while True:
            left = [i for i in self._run_processes().values() if i.alive()]
            for ident in left:
                ident.signal(signal.SIGKILL)
            if (not left and not self._driver_running()) or time.monotonic() > deadline:
                return
            time.sleep(_SWEEP_INTERVAL_S)

    def _kill_leftovers(self) -> None:
        if any(ident.alive() for ident in self._run_processes().values()):
            self._terminate(min(self.grace, 1.0))

    def _result(self, exit_code: int) -> LaunchResult:
        failure = read_failure(self.run_dir)
        if failure is None and exit_code != 0 and not self._stopping:
            sig = None
            if exit_code < 0:
                try:
                    sig = signal.Signals(-exit_code).name
                except ValueError:
                    sig = f"signal {-exit_code}"
            failure = RankFailureInfo(
                rank=None,
                exit_code=exit_code,
                signal=sig,
                stderr_tail=tuple(tail_lines(RunDir(self.run_dir).launcher_log)),
            )
        if self._stopping and failure is not None and failure.signal in ("SIGTERM", "SIGINT"):
            failure = None  # our own teardown, not a rank's failure
        return LaunchResult(exit_code, failure=failure, stopped=self._stopping)


def wait_for(launcher: Launcher, timeout: float) -> LaunchResult | None:
    """Poll until the run ends or ``timeout`` passes (tests, scripts)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = launcher.poll()
        if result is not None:
            return result
        time.sleep(0.05)
    return None
