"""What the launch form shows about this machine, and the recent runs it can reopen.

Both are gathered on a worker thread (torch and NVML take a second or two to answer) and
handed to the UI as plain frozen values.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ddptui.formatting import target_label
from ddptui.monitor import GpuSource
from ddptui.run.machine import Machine
from ddptui.run.rundir import RunDirError, load_run, read_config, read_summary
from ddptui.runfiles import RunDir

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
    outcome: str  # finished | failed | stopped | interrupted (from summary.json)


def recent_runs(root: Path, limit: int = RECENT_RUNS) -> list[RecentRun]:
    """Run directories under ``root`` (newest first), each with its outcome from
    ``summary.json`` (derived from the events for runs that have none)."""
    try:
        dirs = [d for d in root.iterdir() if RunDir(d).config.is_file() and RunDir(d).holds_run()]
    except OSError:
        return []
    dirs.sort(key=lambda d: (RunDir(d).events.stat().st_mtime, d.name), reverse=True)
    runs = []
    for run_dir in dirs[:limit]:
        try:
            config = read_config(run_dir)
            summary = read_summary(run_dir) or load_run(run_dir)[2]
        except RunDirError:
            continue
        runs.append(
            RecentRun(
                run_dir,
                str(config.get("run_id") or run_dir.name),
                target_label(config),
                config.get("world_size"),
                summary["outcome"],
            )
        )
    return runs
