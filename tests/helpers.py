"""Shared helpers for tests that start real runs."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import psutil

from ddptui.constants import PRESTARTED_BY_ENV, RUN_ID_ENV
from ddptui.runfiles import RunDir

ROOT = Path(__file__).resolve().parent.parent
USER_SCRIPT = ROOT / "tests" / "scripts" / "user_ddp.py"
SCRIPTS = ROOT / "tests" / "scripts"


def run_test_script(tmp_path: Path, script: str, *args: str) -> subprocess.CompletedProcess:
    """``ddptui --no-ui`` over ``tests/scripts/SCRIPT``, 2 ranks under torchrun, its run
    directory ``tmp_path/run``; nothing of the run outlives it, whatever happened."""
    run_dir = tmp_path / "run"
    try:
        return subprocess.run(
            [sys.executable, "-m", "ddptui.cli", "--no-ui", "--script", str(SCRIPTS / script),
             "--world-size", "2", "--launcher", "torchrun", "--run-dir", str(run_dir), *args],
            capture_output=True, text=True, timeout=180, cwd=tmp_path,
        )  # fmt: skip
    finally:
        try:
            run_id = json.loads(RunDir(run_dir).config.read_text())["run_id"]
        except (OSError, ValueError, KeyError):
            run_id = None
        for process in processes_of_run(run_id) if run_id else []:
            process.kill()


def processes_of_run(run_id: str) -> list[psutil.Process]:
    """Every live process started for ``run_id`` (identified by its environment)."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and proc.environ().get(RUN_ID_ENV) == run_id:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def prestarted_by(ddptui_pid: int) -> list[psutil.Process]:
    """The live driver the ddptui process ``ddptui_pid`` started before its run had an id
    (``ddptui.run.prestart``; its environment names ddptui instead)."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get(PRESTARTED_BY_ENV) == str(ddptui_pid):
                if proc.status() != psutil.STATUS_ZOMBIE:
                    found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def read_events(run_dir: Path) -> list[dict]:
    """The events of ``run_dir`` recorded so far: its complete lines. Read while the run
    writes, the last line may be half written (a CI run failed decoding
    ``{"kind":"beat",...,"v`` in ``wait_for_steps``): it is the next read's."""
    text = (Path(run_dir) / "events.jsonl").read_text()
    lines = text.split("\n")[:-1]  # after the last newline: nothing, or a line being written
    return [json.loads(line) for line in lines if line.strip()]


def wait_for_steps(run_dir: Path, more_than: int, timeout: float = 90.0) -> str:
    """Wait until the run in ``run_dir`` has recorded more than ``more_than`` step events;
    its run id (fails the test when it never does)."""
    stepped = wait_until(
        lambda: (
            (run_dir / "events.jsonl").exists()
            and sum(e["kind"] == "step" for e in read_events(run_dir)) > more_than
        ),
        timeout,
    )
    assert stepped, f"the ranks never stepped ({run_dir})"
    return read_events(run_dir)[0]["run"]


def step_numbers(events: list[dict], rank: int | None = None) -> list[int]:
    """The numbers of every step the step events (of ``rank``, or all) stand for, in order:
    an event of several very fast steps (``steps``) stands for those up to its own number."""
    return [
        number
        for e in events
        if e["kind"] == "step" and (rank is None or e["rank"] == rank)
        for number in range(e["step"] - e.get("steps", 1) + 1, e["step"] + 1)
    ]


def drain(collector, until, rounds=200):
    """Poll a collector until ``until(events)`` holds, or ``rounds`` polls in a row (of
    0.05 s) found nothing more; the events received."""
    events, idle = [], 0
    while not until(events) and idle < rounds:
        got = collector.poll(0.05)
        events += got
        idle = 0 if got else idle + 1
    return events


def wait_until(predicate, timeout: float, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return None


async def pilot_until(pilot, predicate, timeout: float, interval: float = 0.05) -> None:
    """Let a Textual test app run until ``predicate()`` holds, for at most ``timeout`` seconds
    of wall time (counted by the clock, not by pauses: a loaded machine makes pauses longer)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not done within {timeout} s")
        await pilot.pause(interval)
