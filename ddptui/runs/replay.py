"""``ddptui replay --no-ui RUN_DIR``: a finished or crashed run's summary from its files."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

from ddptui.formatting import amp_label, fmt_duration, fmt_num
from ddptui.run.rundir import load_run


def print_replay(run_dir: Path, out: TextIO | None = None) -> int:
    """Print the run's outcome, evaluations and ranks; raises RunDirError for a bad dir."""
    out = out or sys.stdout
    config, state, summary = load_run(run_dir)
    end = state.last_event_at or 0.0
    target = config.get("script") or config.get("trainer")
    print(
        f"run {state.run_id}: {target} x{state.world_size} ({config.get('launcher')}, "
        f"{config.get('backend')}, {amp_label(config)}) — {summary['outcome']} "
        f"(exit code {summary['exit_code']}), {fmt_duration(state.elapsed(end))}",
        file=out,
    )
    for point in state.eval_history:
        print(
            f"  epoch {point.epoch}: accuracy {fmt_num(point.accuracy)} "
            f"loss {fmt_num(point.loss)} ({point.count} samples)",
            file=out,
        )
    for rank, view in sorted(state.ranks.items()):
        print(
            f"  rank {rank}: {view.state}, pid {view.pid}, {view.device}, "
            f"step {view.step}, loss {fmt_num(view.loss)}, {view.samples_total:,} samples"
            + (f", error: {view.error}" if view.error else ""),
            file=out,
        )
    failure = summary.get("failure")
    if failure:
        print(f"  FAILED: {failure.get('how')}", file=out)
    diagnoses = summary.get("diagnoses")
    for item in diagnoses if isinstance(diagnoses, list) else []:
        if isinstance(item, dict) and isinstance(item.get("detail"), str):
            print(f"  diagnosis: {item['detail'][:500]}", file=out)
    return 0
