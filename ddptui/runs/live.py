"""Which runs are live: a run directory without ``summary.json`` whose run id is carried (in
``DDPTUI_RUN_ID``) by a live process: its launcher driver or one of its ranks.

Used by ``ddptui attach`` to list the runs it can attach to, and to notice that a run it
follows lost its processes without writing a summary (its ddptui was killed).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import psutil

from ddptui import safeio
from ddptui.constants import RUN_ID_ENV
from ddptui.formatting import amp_label, target_label
from ddptui.run.rundir import RunDirError, read_config
from ddptui.runfiles import RunDir

#: Run directories are looked for this many levels below the root (a bench nests its runs).
SCAN_DEPTH = 2
#: Most directories looked at under the root.
MAX_SCANNED = 10_000


def alive_run_ids(wanted: Iterable[str] | None = None) -> set[str]:
    """Run ids carried by live processes (one pass over the process table). With ``wanted``,
    only those are looked for (and the pass stops once all are found)."""
    want = set(wanted) if wanted is not None else None
    if want is not None and not want:
        return set()
    found: set[str] = set()
    me = os.getpid()
    for proc in psutil.process_iter(["pid"]):
        if proc.pid == me:
            continue
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            run_id = proc.environ().get(RUN_ID_ENV)
        except (psutil.Error, OSError):
            continue
        if run_id and (want is None or run_id in want):
            found.add(run_id)
            if want is not None and found >= want:
                break
    return found


def run_is_alive(run_id: str) -> bool:
    return bool(alive_run_ids([run_id]))


@dataclass(frozen=True)
class RunEntry:
    """A run directory that has not written its summary yet."""

    path: Path
    run_id: str
    config: dict
    #: Seconds since events.jsonl last changed.
    quiet_s: float

    @property
    def label(self) -> str:
        return (
            f"{target_label(self.config)} x{self.config.get('world_size', '?')} "
            f"({self.config.get('launcher', '?')}, {self.config.get('backend', '?')}, "
            f"{amp_label(self.config)})"
        )


def _candidates(root: Path) -> list[Path]:
    found: list[Path] = []
    level = [root]
    scanned = 0
    for _ in range(SCAN_DEPTH):
        below: list[Path] = []
        for directory in level:
            try:
                children = sorted(p for p in directory.iterdir() if p.is_dir())
            except OSError:
                continue
            for child in children:
                scanned += 1
                if scanned > MAX_SCANNED:
                    return found
                if RunDir(child).holds_run():
                    found.append(child)
                else:
                    below.append(child)
        level = below
    return found


def unfinished_runs(
    root: str | os.PathLike[str] = "runs", skipped: list[str] | None = None
) -> list[RunEntry]:
    """Run directories under ``root`` with events but no summary.json, newest first. A run
    whose files cannot be read is left out; with ``skipped``, a one-line note on it is
    appended there."""
    entries = []
    now = time.time()
    for path in _candidates(Path(root)):
        files = RunDir(path)
        if os.path.lexists(files.summary):
            continue
        try:
            config = read_config(path)
            mtime = files.events.stat().st_mtime
        except (RunDirError, OSError) as exc:
            if skipped is not None:
                skipped.append(str(exc) if isinstance(exc, RunDirError) else safeio.why(exc))
            continue
        run_id = str(config.get("run_id") or path.name)
        entries.append(RunEntry(path, run_id, config, max(0.0, now - mtime)))
    entries.sort(key=lambda e: e.quiet_s)
    return entries


def live_runs(
    root: str | os.PathLike[str] = "runs", skipped: list[str] | None = None
) -> list[RunEntry]:
    """Unfinished runs under ``root`` that a live process still carries, newest first
    (``skipped``: as for :func:`unfinished_runs`)."""
    entries = unfinished_runs(root, skipped)
    alive = alive_run_ids(e.run_id for e in entries)
    return [e for e in entries if e.run_id in alive]
