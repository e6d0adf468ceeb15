"""One launcher interface for both launchers: start, poll, stop.

The ranks run under a driver child process (``ddptui.launch.drivers``) in its own session:
mp.spawn or torchrun. Teardown — on stop, Ctrl-C, or a rank's failure — sends SIGTERM to
every process of the run, then SIGKILL after a grace period. "Every process" is the driver's
process tree plus anything whose environment carries this run's ``DDPTUI_RUN_ID`` (torchrun
starts each worker in a session of its own, and an orphaned rank leaves the tree), so no
process is left behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import psutil

from ddptui.constants import ENDPOINT_ENV, LAUNCHERS, RUN_DIR_ENV, RUN_ID_ENV
from ddptui.rundir import RunDir
from ddptui.state import RankFailureInfo

STDERR_TAIL_LINES = 15


@dataclass(frozen=True)
class LaunchResult:
    """How the processes ended. ``failure`` names the first failing rank when there is one."""

    returncode: int
    failure: RankFailureInfo | None = None
    stopped: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.stopped and self.failure is None

    @property
    def outcome(self) -> str:
        return "stopped" if self.stopped else ("finished" if self.ok else "failed")


def tail_lines(path: Path, n: int = STDERR_TAIL_LINES, max_bytes: int = 64 * 1024) -> list[str]:
    """Last ``n`` lines of a text file (reads at most ``max_bytes`` from its end)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return []
    lines = data.decode("utf-8", "replace").splitlines()
    return list(deque((ln for ln in lines if ln.strip()), maxlen=n))


def read_failure(run_dir: Path) -> RankFailureInfo | None:
    """The first failing rank as the driver recorded it in the run directory, with the tail
    of that rank's log; None when the driver recorded no rank failure."""
    try:
        info = json.loads(RunDir(run_dir).result.read_text())
    except (OSError, ValueError):
        return None
    rank = info.get("rank")
    return RankFailureInfo(
        rank=rank,
        exit_code=info.get("exit_code"),
        signal=info.get("signal"),
        error=info.get("error"),
        stderr_tail=tuple(tail_lines(RunDir(run_dir).rank_log(rank))) if rank is not None else (),
    )


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
        extra_env: dict[str, str] | None = None,
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
        self.args = list(args)
        self.grace = grace
        #: More environment for every process of the run (e.g. DDPTUI_NO_INSTRUMENT=1).
        self.extra_env = dict(extra_env or {})
        self.process: subprocess.Popen[bytes] | None = None
        self.result: LaunchResult | None = None
        self._stopping = False

    def command(self) -> list[str]:
        cmd = [
            sys.executable,
            "-m",
            "ddptui.launch.drivers",
            self.kind,
            "--nprocs",
            str(self.world_size),
            "--run-dir",
            str(self.run_dir),
            "--result",
            str(RunDir(self.run_dir).result),
        ]
        cmd += ["--module", self.module] if self.module else ["--script", str(self.script)]
        return [*cmd, "--", *self.args]

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env[RUN_ID_ENV] = self.run_id
        env[RUN_DIR_ENV] = str(self.run_dir)
        env["PYTHONUNBUFFERED"] = "1"
        env.update(self.extra_env)
        if self.endpoint:
            env[ENDPOINT_ENV] = self.endpoint
        else:
            env.pop(ENDPOINT_ENV, None)
        return env

    # -- the interface ----------------------------------------------------------------------
    def start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        RunDir(self.run_dir).result.unlink(missing_ok=True)
        with open(RunDir(self.run_dir).launcher_log, "ab") as log:
            self.process = subprocess.Popen(
                self.command(),
                env=self.environment(),
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

    # -- internals ----------------------------------------------------------------------------
    def _run_processes(self) -> list[psutil.Process]:
        """The driver, its descendants, and any process carrying this run's id."""
        found: dict[int, psutil.Process] = {}
        if self.process is not None:
            try:
                driver = psutil.Process(self.process.pid)
                found[driver.pid] = driver
                for child in driver.children(recursive=True):
                    found[child.pid] = child
            except psutil.NoSuchProcess:
                pass
        me = os.getpid()
        for proc in psutil.process_iter(["pid"]):
            if proc.pid in found or proc.pid == me:
                continue
            try:
                if proc.environ().get(RUN_ID_ENV) == self.run_id:
                    found[proc.pid] = proc
            except (psutil.Error, OSError):
                continue
        return list(found.values())

    def _terminate(self, grace: float) -> None:
        procs = self._run_processes()
        if self.process is not None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
        for proc in procs:
            try:
                proc.send_signal(signal.SIGTERM)
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(procs, timeout=grace)
        # Anything that appeared meanwhile (a rank mid-start) is caught by a second sweep.
        alive = {p.pid: p for p in alive}
        for proc in self._run_processes():
            alive.setdefault(proc.pid, proc)
        for proc in alive.values():
            try:
                proc.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(list(alive.values()), timeout=grace)

    def _kill_leftovers(self) -> None:
        leftovers = self._run_processes()
        if leftovers:
            self._terminate(min(self.grace, 1.0))

    def _result(self, returncode: int) -> LaunchResult:
        failure = read_failure(self.run_dir)
        if failure is None and returncode != 0 and not self._stopping:
            sig = None
            if returncode < 0:
                try:
                    sig = signal.Signals(-returncode).name
                except ValueError:
                    sig = f"signal {-returncode}"
            failure = RankFailureInfo(
                rank=None,
                exit_code=returncode,
                signal=sig,
                stderr_tail=tuple(tail_lines(RunDir(self.run_dir).launcher_log)),
            )
        if self._stopping and failure is not None and failure.signal in ("SIGTERM", "SIGINT"):
            failure = None  # our own teardown, not a rank's failure
        return LaunchResult(returncode, failure=failure, stopped=self._stopping)


def wait_for(launcher: Launcher, timeout: float) -> LaunchResult | None:
    """Poll until the run ends or ``timeout`` passes (tests, scripts)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = launcher.poll()
        if result is not None:
            return result
        time.sleep(0.05)
    return None
