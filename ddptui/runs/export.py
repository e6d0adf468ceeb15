"""``ddptui export RUN_DIR --csv FILE | --tensorboard DIR``: a run's numbers for spreadsheets
and TensorBoard.

- CSV: one row per ``step`` or ``eval`` event of the run, in file order (``-`` writes to
  stdout). Columns: ``kind, rank, t, seq, epoch, step, loss, samples, samples_per_s,
  step_time, accuracy, eval_loss, count, metrics, steps`` (the extra metrics as a JSON
  object; ``steps``: how many optimizer steps a step row stands for, more than 1 where the
  hooks sent a very fast script's steps a few at a time: ``step`` is the last one's, its
  ``samples`` and ``step_time`` their sums, its ``loss`` the last one's).
- TensorBoard (``pip install 'ddptui[tensorboard]'``): scalars per rank
  (``rank{N}/loss``, ``rank{N}/samples_per_s``, ``rank{N}/step_time`` (one step's: a row of
  several steps gives their mean) and every numeric extra
  metric, such as ``rank{N}/lr``) against the rank's step, and for the whole run
  (``global/loss``: mean over the ranks that logged that step, ``global/samples_per_s``: sum
  over them, ``global/eval_accuracy`` and ``global/eval_loss`` against the epoch: the
  figures the dashboard shows, rank 0's where the ranks' differ), each at the event's wall
  time. System metrics are exported once the run directory records them (today
  ``events.jsonl`` holds none).

A running run exports what it has written so far; a half-written last line is skipped.
Headless: never imports Textual.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TextIO

from ddptui import protocol, safeio
from ddptui.commands import UsageError, command_main, fail
from ddptui.run.rundir import (
    EventLines,
    RunDirError,
    read_config,
    require_events,
    unread_note,
)
from ddptui.run.state import EvalIndex, eval_replaces

CSV_COLUMNS = (
    "kind",
    "rank",
    "t",
    "seq",
    "epoch",
    "step",
    "loss",
    "samples",
    "samples_per_s",
    "step_time",
    "accuracy",
    "eval_loss",
    "count",
    "metrics",
    "steps",
)
TENSORBOARD_HINT = "pip install 'ddptui[tensorboard]'"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = "Export a run's steps and evaluations to CSV or TensorBoard."
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (finished or running)")
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--csv", metavar="FILE", help="write a CSV file ('-' for stdout)")
    target.add_argument("--tensorboard", metavar="DIR", help="write TensorBoard event files")


def main(argv: list[str] | None = None) -> int:
    return command_main("ddptui export", __doc__ or "", add_arguments, run, argv)


def run_events(run_dir: Path) -> EventLines:
    """The run's events (its own run id only), read as iterated; its ``unread`` counts the
    lines that were no event. Raises RunDirError for a bad directory."""
    require_events(run_dir)
    config = read_config(run_dir)
    return EventLines(run_dir, config.get("run_id") or Path(run_dir).name)


# -- CSV --------------------------------------------------------------------------------------
def _cell(value: Any) -> Any:
    return "" if value is None else value


def csv_row(event: protocol.AnyEvent) -> tuple | None:
    """The CSV row of a step or eval event (None for any other kind)."""
    if isinstance(event, protocol.Step):
        values = (
            "step",
            event.step,
            event.loss,
            event.samples,
            event.samples_per_s,
            event.step_time,
            None,
            None,
            None,
        )
    elif isinstance(event, protocol.Eval):
        values = ("eval", None, None, None, None, None, event.accuracy, event.loss, event.count)
    else:
        return None
    kind, step, loss, samples, sps, step_time, accuracy, eval_loss, count = values
    metrics = json.dumps(event.metrics, sort_keys=True) if event.metrics else ""
    return tuple(
        _cell(v)
        for v in (
            kind,
            event.rank,
            event.t,
            event.seq,
            event.epoch,
            step,
            loss,
            samples,
            sps,
            step_time,
            accuracy,
            eval_loss,
            count,
        )
    ) + (metrics, event.steps if isinstance(event, protocol.Step) else "")


def write_csv(events: Iterable[protocol.AnyEvent], out: TextIO) -> int:
    """Write the header and one row per step or eval event; returns the number of rows."""
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    rows = 0
    for event in events:
        row = csv_row(event)
        if row is not None:
            writer.writerow(row)
            rows += 1
    return rows


def export_csv(
    events: Iterable[protocol.AnyEvent], target: str, stdout: TextIO | None = None
) -> int:
    """Write the CSV of ``events`` to ``target`` (``-``: stdout); see
    :func:`ddptui.safeio.write_output` for how a file, a device, a FIFO or a symlink is
    written. Raises :class:`UsageError` (exit 2) when ``target`` may not be written (a file
    of a run directory, a directory) and :class:`OSError` when writing fails."""
    if target == "-":
        return write_csv(events, stdout or sys.stdout)
    path = Path(target).expanduser()
    if safeio.is_dir(path):
        raise UsageError(f"--csv names a directory: {safeio.shown(path)}")
    if not safeio.is_dir(Path(os.path.realpath(path)).parent):
        raise UsageError(f"cannot write {safeio.shown(path)}: no such directory")
    try:
        return safeio.write_output(path, lambda f: write_csv(events, f))
    except safeio.UnsafeFile as exc:
        raise UsageError(f"--csv {safeio.shown(path)}: {exc.strerror}") from None


# -- TensorBoard ------------------------------------------------------------------------------
def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def tensorboard_scalars(
    events: Iterable[protocol.AnyEvent],
) -> Iterator[tuple[str, float, int, float]]:
    """``(tag, value, step, wall_time)`` for every scalar of the export (see the module)."""
    loss_at: dict[int, list[float]] = {}
    sps_at: dict[int, list[float]] = {}
    time_at: dict[int, float] = {}
    # Per evaluation, the event that counts and its place among them (see RunState._on_eval).
    evals: dict[tuple[int | None, int], tuple[protocol.Eval, int]] = {}
    index = EvalIndex()
    for event in events:
        if isinstance(event, protocol.Step):
            prefix, step, t = f"rank{event.rank}/", event.step, event.t
            step_time = event.step_time
            if step_time is not None and event.steps > 1:  # several steps' time: one's
                step_time /= event.steps
            for name, value in (
                ("loss", event.loss),
                ("samples_per_s", event.samples_per_s),
                ("step_time", step_time),
                *sorted(event.metrics.items()),
            ):
                number = _number(value)
                if number is not None:
                    yield prefix + name, number, step, t
            if event.loss is not None:
                loss_at.setdefault(step, []).append(event.loss)
            if event.samples_per_s is not None:
                sps_at.setdefault(step, []).append(event.samples_per_s)
            time_at[step] = max(time_at.get(step, t), t)
        elif isinstance(event, protocol.Eval):
            # All-reduced: every rank reports the same result; the first one counts (each of
            # an epoch's evaluations, at the epoch), until one that replaces it, as on the
            # dashboard (a later attempt's, a lower rank's: see eval_replaces).
            key = index.key(event)
            old = evals.get(key)
            if old is None:
                evals[key] = (event, len(evals) + 1)
            elif eval_replaces(old[0].attempt, old[0].rank, event.attempt, event.rank):
                evals[key] = (event, old[1])
    for event, n in evals.values():
        x = event.epoch if event.epoch is not None else n
        for name, value in (
            ("eval_accuracy", event.accuracy),
            ("eval_loss", event.loss),
            *sorted((f"eval_{k}", v) for k, v in event.metrics.items()),
        ):
            number = _number(value)
            if number is not None:
                yield f"global/{name}", number, x, event.t
    for step in sorted(loss_at):
        values = [v for v in loss_at[step] if math.isfinite(v)]
        mean = sum(values) / len(values) if values else math.nan
        yield "global/loss", mean, step, time_at[step]
    for step in sorted(sps_at):
        yield "global/samples_per_s", sum(sps_at[step]), step, time_at[step]


def export_tensorboard(events: Iterable[protocol.AnyEvent], target: str) -> int:
    """Write the scalars of ``events`` with torch's SummaryWriter; returns how many were
    written."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise UsageError(
            f"--tensorboard needs the tensorboard package ({TENSORBOARD_HINT})"
        ) from None
    path = Path(target).expanduser()
    try:
        there = safeio.path_state(path)
    except OSError as exc:
        raise UsageError(f"--tensorboard {safeio.shown(path)}: {exc.strerror}") from None
    if there is not None and not safeio.is_dir(path):
        raise UsageError(f"--tensorboard names a file: {safeio.shown(path)}")
    count = 0
    try:
        writer = SummaryWriter(log_dir=str(path))
    except OSError as exc:
        raise UsageError(f"cannot write {safeio.shown(path)}: {exc.strerror or exc}") from None
    try:
        for tag, value, step, wall_time in tensorboard_scalars(events):
            writer.add_scalar(tag, value, global_step=step, walltime=wall_time)
            count += 1
    finally:
        writer.close()
    return count


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    run_dir = Path(args.run_dir)
    try:
        events = run_events(run_dir)
        if args.csv is not None:
            rows = export_csv(events, args.csv, out)
            if args.csv != "-":
                print(f"{rows} rows -> {safeio.shown(args.csv)}", file=out or sys.stdout)
        else:
            count = export_tensorboard(events, args.tensorboard)
            print(f"{count} scalars -> {safeio.shown(args.tensorboard)}", file=out or sys.stdout)
        if events.unread:  # on stderr: never inside a CSV written to stdout
            print(f"ddptui: events.jsonl: {unread_note(events.unread)}", file=sys.stderr)
    except (RunDirError, UsageError) as exc:
        return fail(str(exc))
    except OSError as exc:  # the output could not be written (ENOSPC, EROFS, EACCES): exit 1
        target = args.csv if args.csv is not None else args.tensorboard
        return fail(f"cannot write {safeio.shown(target)}: {exc.strerror or exc}", 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
