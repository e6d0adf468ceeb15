"""``ddptui attach [RUN_DIR]``: the live dashboard on a run that another ddptui process (for
example ``ddptui --no-ui`` in tmux) is running. It follows the run's ``events.jsonl`` as it
grows; stop and restart stay with the owning process. Without RUN_DIR it lists the live runs
under ``runs/`` (a run is live while it has no summary.json and a process carries its id).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TextIO

from ddptui.commands import command_main, fail, no_terminal
from ddptui.formatting import fmt_duration

#: Unreadable run directories named one by one in the listing (the rest are counted).
MAX_NOTES = 10


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = "Open the live dashboard on a run another ddptui process is running."
    p.add_argument("run_dir", nargs="?", metavar="RUN_DIR", help="the run (omit: list live runs)")
    p.add_argument("--runs-root", default="runs", help="where to look for live runs (runs)")


def main(argv: list[str] | None = None) -> int:
    return command_main("ddptui attach", __doc__ or "", add_arguments, run, argv)


def list_live(root: Path, out: TextIO) -> int:
    from ddptui.liveruns import live_runs

    skipped: list[str] = []
    entries = live_runs(root, skipped)
    for note in skipped[:MAX_NOTES]:
        out.write(f"skipped: {note}\n")
    if len(skipped) > MAX_NOTES:
        out.write(f"skipped {len(skipped) - MAX_NOTES} more unreadable run directories\n")
    if not entries:
        out.write(f"no live runs under {root}/\n")
        return 0
    out.write(f"live runs under {root}/ (attach with: ddptui attach RUN_DIR):\n")
    width = max(len(str(e.path)) for e in entries)
    for e in entries:
        out.write(
            f"  {str(e.path).ljust(width)}  {e.label}  last event {fmt_duration(e.quiet_s)} ago\n"
        )
    return 0


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    from ddptui.rundir import RunDirError, read_config, require_events

    out = out or sys.stdout
    if args.run_dir is None:
        return list_live(Path(args.runs_root), out)
    run_dir = Path(args.run_dir)
    try:
        require_events(run_dir)
        read_config(run_dir)
    except RunDirError as exc:
        return fail(str(exc))
    if no_terminal("attach runs in a terminal"):
        return fail(no_terminal("attach runs in a terminal"))
    try:
        from ddptui.tui.screens.attach import run_attach
    except ImportError as exc:
        return fail(f"the dashboard is not available ({exc})")
    try:
        return run_attach(run_dir)
    except RunDirError as exc:
        return fail(str(exc))


if __name__ == "__main__":
    sys.exit(main())
