"""The real-world tier's runs: each script of ``tests/scripts/realworld`` run once under
``ddptui --no-ui``, a few at a time, shared by the tests that read them.

A :class:`RunSpec` says how a script is started (arguments, environment, world size,
launcher, hang timeout) and what plain torchrun would exit with for it. A :class:`RunPool`
starts the runs the selected tests need as soon as it is made (the longest first, at most
``parallel`` at once, each bounded in time), and :meth:`RunPool.result` waits for one. Every
process a run started is found by the run's id and killed when it ends, even on failure.

Each script prints ``REALWORLD rank=… steps=… last_loss=… epoch_steps=…`` on every rank that
reached its end (see ``tests/scripts/realworld/facts.py``); :func:`parse_facts` reads those
lines back from the rank logs, so the tests hold ddptui's record against the script's own.
"""

from __future__ import annotations

import ast
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.helpers import ROOT, prestarted_by, processes_of_run, read_events, step_numbers

SCRIPTS = ROOT / "tests" / "scripts" / "realworld"
#: The most seconds one run may take before it is killed (a hang verdict that never comes).
RUN_LIMIT_S = 200.0
#: A facts line runs to the line's end or to the next facts line: spawned workers share their
#: parent's log, and under PYTHONUNBUFFERED a print's text and its newline are two writes, so
#: one worker's line can end where another's begins (``...1:10REALWORLD rank=0 ...``).
_FACTS = re.compile(r"REALWORLD ((?:(?!REALWORLD )[^\r\n])*)")


@dataclass(frozen=True)
class RunSpec:
    """One ddptui run of a real-world script.

    ``args`` and ``env`` are functions of the run's own scratch directory (data, snapshots,
    rendezvous files go there); ``setup`` writes what the script reads before it starts.
    ``plain_exit`` is plain torchrun's exit code for the same script and faults, from the
    script's contract: 0 when every rank reaches its end, 1 when a rank raises or is killed
    (torchrun's ChildFailedError), None for a hang (plain torchrun never returns).
    """

    name: str
    script: str
    args: Callable[[Path], list[str]] = lambda work: []
    env: Callable[[Path], dict[str, str]] = lambda work: {}
    setup: Callable[[Path], None] | None = None
    world_size: int = 2  # ddptui's --world-size: processes it starts, not always the ranks
    launcher: str = "torchrun"
    hang_timeout: float | None = None
    ranks: int = 2  # the ranks of the script's process group
    plain_exit: int | None = 0
    cost: float = 1.0  # relative wall time, to start the longest runs first


@dataclass
class RunResult:
    """What one run left: ddptui's exit code and output, the run directory's record, the
    script's own facts per rank, and the processes that outlived it (killed since)."""

    spec: RunSpec = field(repr=False)
    run_dir: Path
    work: Path
    returncode: int | None
    stdout: str = field(repr=False)
    stderr: str = field(repr=False)
    wall_s: float
    ended: float  # time.time() when ddptui had exited (its output closed)
    leftovers: list[int] = field(default_factory=list)

    @property
    def summary(self) -> dict:
        return json.loads((self.run_dir / "summary.json").read_text())

    @property
    def events(self) -> list[dict]:
        return read_events(self.run_dir)

    def steps(self, rank: int) -> list[dict]:
        """ddptui's step events of ``rank``, in order."""
        return [e for e in self.events if e["kind"] == "step" and e["rank"] == rank]

    def step_numbers(self, rank: int) -> list[int]:
        """The numbers of every step ``rank``'s step events stand for, in order."""
        return step_numbers(self.events, rank)

    @property
    def facts(self) -> dict[int, dict]:
        return parse_facts(self.run_dir)

    def describe(self) -> str:
        """ddptui's output and the rank logs' ends, for an assertion message."""
        logs = "".join(
            f"\n--- {p.name}\n{p.read_text(errors='replace')[-1500:]}"
            for p in sorted(self.run_dir.glob("rank-*.log"))
        )
        head = f"{self.spec.name}: exit {self.returncode} after {self.wall_s:.0f} s"
        return f"{head}\n{self.stdout[-3000:]}\n{self.stderr[-2000:]}{logs}"


def parse_facts(run_dir: Path) -> dict[int, dict]:
    """The scripts' ``REALWORLD`` lines from every rank log, by the rank the line names."""
    facts: dict[int, dict] = {}
    for log in sorted(Path(run_dir).glob("rank-*.log")):
        for match in _FACTS.finditer(log.read_text(errors="replace")):
            line = dict(item.split("=", 1) for item in match.group(1).split())
            pairs = [pair.split(":") for pair in line.pop("epoch_steps", "").split(",") if pair]
            parsed: dict = {key: ast.literal_eval(value) for key, value in line.items()}
            parsed["epoch_steps"] = {int(epoch): int(count) for epoch, count in pairs}
            facts[parsed["rank"]] = parsed
    return facts


def _command(spec: RunSpec, run_dir: Path, work: Path) -> list[str]:
    # ddptui.console: the ddptui command itself (a torchrun run's driver starts first)
    cmd = [
        sys.executable,
        "-m",
        "ddptui.console",
        "--no-ui",
        "--script",
        str(SCRIPTS / spec.script),
    ]
    cmd += ["--world-size", str(spec.world_size), "--launcher", spec.launcher]
    cmd += ["--run-dir", str(run_dir), "--device", "cpu"]
    if spec.hang_timeout is not None:
        cmd += ["--hang-timeout", f"{spec.hang_timeout:g}"]
    args = spec.args(work)
    return cmd + (["--", *args] if args else [])


def run_once(
    spec: RunSpec,
    root: Path,
    limit_s: float = RUN_LIMIT_S,
    started: Callable[[subprocess.Popen], None] = lambda proc: None,
) -> RunResult:
    """Run ``spec`` under ddptui in ``root/<name>``; nothing it started is left running.
    ``started`` is told the ddptui process (for a teardown that cannot wait for the run)."""
    work = root / spec.name / "work"
    run_dir = root / spec.name / "run"
    work.mkdir(parents=True)
    if spec.setup is not None:
        spec.setup(work)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RW_"))}
    env.update(PYTHONPATH=str(ROOT), **spec.env(work))
    began = time.monotonic()
    proc = subprocess.Popen(
        _command(spec, run_dir, work),
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    started(proc)
    try:
        stdout, stderr = proc.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        stderr += f"\n[realworld] killed after {limit_s:g} s"
    finally:
        if proc.poll() is None:  # the test process itself is being interrupted
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        ended = time.time()
        leftovers = _kill_leftovers(run_dir, proc.pid)
    wall_s = time.monotonic() - began
    return RunResult(spec, run_dir, work, proc.returncode, stdout, stderr, wall_s, ended, leftovers)


def _kill_leftovers(run_dir: Path, ddptui_pid: int | None = None) -> list[int]:
    """Kill whatever the run started that is still alive (the driver ddptui started before
    it knew its run too); return their pids."""
    try:
        run_id = json.loads((run_dir / "config.json").read_text())["run_id"]
    except (OSError, ValueError, KeyError):
        run_id = None
    leftovers = processes_of_run(run_id) if run_id else []
    if ddptui_pid is not None:
        leftovers += prestarted_by(ddptui_pid)
    for proc in leftovers:
        try:
            proc.kill()
        except Exception:  # gone meanwhile
            pass
    return [p.pid for p in leftovers]


class RunPool:
    """Runs the named specs, at most ``parallel`` at once, the costliest first; started at
    construction, each in its own thread. :meth:`result` waits for one run."""

    def __init__(self, specs: dict[str, RunSpec], names: set[str], root: Path, parallel: int):
        self._slots = threading.Semaphore(parallel)
        self._results: dict[str, RunResult | BaseException] = {}
        self._threads: dict[str, threading.Thread] = {}
        self._procs: list[subprocess.Popen] = []
        self._root = root
        self.started = time.monotonic()
        self.finished_at: float | None = None
        for name in sorted(names, key=lambda n: -specs[n].cost):
            thread = threading.Thread(
                target=self._run, args=(specs[name], root), name=f"realworld-{name}", daemon=True
            )
            self._threads[name] = thread
        for thread in self._threads.values():  # in cost order: the semaphore is roughly FIFO
            thread.start()
            time.sleep(0.01)

    def _run(self, spec: RunSpec, root: Path) -> None:
        with self._slots:
            try:
                self._results[spec.name] = run_once(spec, root, started=self._procs.append)
            except BaseException as exc:  # reported by result()
                self._results[spec.name] = exc
        if all(name in self._results for name in self._threads):
            self.finished_at = time.monotonic()

    def result(self, name: str) -> RunResult:
        self._threads[name].join()
        outcome = self._results[name]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def wait_all(self) -> None:
        for thread in self._threads.values():
            thread.join()

    def close(self) -> None:
        """Kill every run still going (an interrupted session) and what each one started."""
        for proc in self._procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        for run_dir in self._root.glob("*/run"):
            _kill_leftovers(run_dir)
