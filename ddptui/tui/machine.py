"""What the launch form shows about this machine, and the recent runs it can reopen.

Both are gathered on a worker thread (torch and NVML take a second or two to answer) and
handed to the UI as plain frozen values.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path

from ddptui import protocol
from ddptui.config import Machine
from ddptui.launch import tail_lines
from ddptui.rundir import CONFIG_FILE, EVENTS_FILE, RESULT_FILE
from ddptui.tui.model import config_label

#: Recent runs listed on the launch screen.
RECENT_RUNS = 12


@dataclass(frozen=True)
class HostInfo:
    """CUDA as torch sees it (what the run options are checked against), plus NVML's GPU
    names and the host's RAM, for display."""

    machine: Machine
    ram_total: int | None
    gpu_names: tuple[str, ...] = ()
    gpu_reason: str | None = None


def detect_host() -> HostInfo:
    """The real machine (slow: imports torch, starts NVML)."""
    import psutil

    from ddptui.monitor import GpuSource

    machine = Machine.detect()
    with GpuSource() as gpus:
        report = gpus.sample()
    names = tuple(f"{g.index}: {g.name}" for g in report.devices)
    return HostInfo(
        machine, psutil.virtual_memory().total, names, None if report.available else report.reason
    )


@dataclass(frozen=True)
class RecentRun:
    run_dir: Path
    run_id: str
    target: str
    world_size: int | None
    outcome: str  # finished | failed | stopped | incomplete


def recent_runs(root: Path, limit: int = RECENT_RUNS) -> list[RecentRun]:
    """Run directories under ``root`` (newest first), each judged from its last events."""
    try:
        dirs = [
            d for d in root.iterdir() if (d / CONFIG_FILE).is_file() and (d / EVENTS_FILE).is_file()
        ]
    except OSError:
        return []
    dirs.sort(key=lambda d: ((d / EVENTS_FILE).stat().st_mtime, d.name), reverse=True)
    runs = []
    for run_dir in dirs[:limit]:
        try:
            config = json.loads((run_dir / CONFIG_FILE).read_text())
        except (OSError, ValueError):
            continue
        world = config.get("world_size")
        runs.append(
            RecentRun(
                run_dir,
                str(config.get("run_id") or run_dir.name),
                config_label(config),
                world,
                _outcome(run_dir, world),
            )
        )
    return runs


def _outcome(run_dir: Path, world_size: int | None) -> str:
    if (run_dir / RESULT_FILE).is_file():
        with contextlib.suppress(OSError, ValueError):
            if json.loads((run_dir / RESULT_FILE).read_text()).get("rank") is not None:
                return "failed"
    states: dict[int, str] = {}
    for line in tail_lines(run_dir / EVENTS_FILE, 200):
        with contextlib.suppress(protocol.InvalidEvent):
            event = protocol.from_json(line)
            if isinstance(event, protocol.Status):
                states[event.rank] = event.state
    if "failed" in states.values():
        return "failed"
    if (
        states
        and all(s == "finished" for s in states.values())
        and len(states) >= (world_size or 1)
    ):
        return "finished"
    return "incomplete"
