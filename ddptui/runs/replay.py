"""``ddptui replay --no-ui RUN_DIR``: a finished or crashed run's summary from its files."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

from ddptui.formatting import (
    amp_label,
    fmt_duration,
    fmt_epoch,
    fmt_num,
    printable,
    target_label,
)
from ddptui.run.rundir import load_run, unread_note


def print_replay(run_dir: Path, out: TextIO | None = None) -> int:
    """Print the run's outcome, evaluations and ranks; raises RunDirError for a bad dir."""
    out = out or sys.stdout

    def emit(text: str) -> None:
        """One line from the run's files (a rank's error, a device): never an escape."""
        out.write(printable(text) + "\n")

    config, state, summary = load_run(run_dir)
    end = state.last_event_at or 0.0
    target = target_label(config)
    emit(
        f"run {state.run_id}: {target} x{state.world_size} ({config.get('launcher')}, "
        f"{config.get('backend')}, {amp_label(config)}) — {summary['outcome']} "
        f"(exit code {summary['exit_code']}), {fmt_duration(state.elapsed(end))}"
    )
    for point in state.eval_history:
        # as the run's own lines said it: ``epoch 1/2``, the count where one was given
        count = f" ({point.count:,} samples)" if point.count is not None else ""
        emit(
            f"  epoch {fmt_epoch(state, point.epoch)}: accuracy {fmt_num(point.accuracy)} "
            f"eval loss {fmt_num(point.loss)}{count}"
        )
    for rank, view in sorted(state.ranks.items()):
        emit(
            f"  rank {rank}: {view.state}, pid {view.pid}, {view.device}, "
            f"step {view.step}, loss {fmt_num(view.loss)}, {view.samples_total:,} samples"
            + (f", error: {view.error}" if view.error else "")
        )
    failure = summary.get("failure")
    if failure:
        emit(f"  FAILED: {failure.get('how')}")
    diagnoses = summary.get("diagnoses")
    for item in diagnoses if isinstance(diagnoses, list) else []:
        if isinstance(item, dict) and isinstance(item.get("detail"), str):
            emit(f"  diagnosis: {item['detail'][:500]}")
    if state.lines_unread:
        emit(f"  events.jsonl: {unread_note(state.lines_unread)}")
    return 0
