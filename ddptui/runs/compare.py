"""``ddptui compare RUN_DIR RUN_DIR...``: runs side by side.

For each run: the options that differ between the runs (from ``config.json``), how it ended,
final and best accuracy, time, steady-state samples/s (the bench's rule,
:mod:`ddptui.runs.benchmath`), and its failure or restarts (from ``summary.json``, or derived once
for a run that has none, through :func:`ddptui.run.rundir.load_run`). ``--no-ui`` prints the table;
the dashboard overlays the runs' loss and accuracy curves. Headless: never imports Textual.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from ddptui.commands import UsageError, command_main, fail, no_terminal
from ddptui.formatting import fmt_duration, fmt_num
from ddptui.run.rundir import RunDirError, iter_events, load_run
from ddptui.runs import benchmath

#: Most runs one comparison holds.
MAX_RUNS = 16
#: Widest cell of the console table.
MAX_CELL = 36
#: Options never compared (every run has its own).
IGNORED_OPTIONS = ("run_id", "run_dir")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = "Compare finished, failed or running runs side by side."
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="two or more run directories")
    p.add_argument("--no-ui", action="store_true", help="print the table instead")


def main(argv: list[str] | None = None) -> int:
    return command_main("ddptui compare", __doc__ or "", add_arguments, run, argv)


@dataclass
class RunFacts:
    """One run, as compared."""

    path: Path
    label: str
    config: dict[str, Any]
    state: Any  # RunState
    summary: dict[str, Any]
    #: The bench's steady-state samples/s with the run's own interval (benchmath.run_interval).
    rate: benchmath.Spread | None

    @property
    def outcome(self) -> str:
        return str(self.summary.get("outcome") or self.state.outcome or "?")

    @property
    def final_accuracy(self) -> float | None:
        last = self.state.last_eval
        return last.accuracy if last is not None else None

    @property
    def best(self) -> tuple[float, int | None] | None:
        """Best evaluation accuracy and its epoch."""
        points = [p for p in self.state.eval_history if p.accuracy is not None]
        if not points:
            return None
        best = max(points, key=lambda p: p.accuracy)
        return best.accuracy, best.epoch

    @property
    def duration_s(self) -> float | None:
        value = self.summary.get("duration_s")
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        state = self.state
        return state.elapsed(state.last_event_at or 0.0) if state.started_at else None

    @property
    def failure(self) -> str | None:
        doc = self.summary.get("failure")
        if isinstance(doc, dict):
            return str(doc.get("how") or doc.get("error") or "failed")
        return None

    @property
    def restarts(self) -> int | None:
        value = self.summary.get("restarts")
        return value if isinstance(value, int) and not isinstance(value, bool) else None


def load_facts(run_dir: str | Path) -> RunFacts:
    """Read one run (raises RunDirError with a one-line message)."""
    from ddptui.run.rundir import require_events

    path = Path(run_dir)
    require_events(path)
    config, state, summary = load_run(path)
    by_rank = benchmath.group_steps(benchmath.step_points(iter_events(path, state.run_id)))
    return RunFacts(
        path, path.name or str(path), config, state, summary, benchmath.run_interval(by_rank)
    )


def _option_text(value: Any) -> str:
    if value is None:
        return "--"
    if isinstance(value, list | tuple):
        return " ".join(str(v) for v in value) or "(none)"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def differing_options(configs: list[dict[str, Any]]) -> list[str]:
    """Option names whose values are not the same in every config (in config order)."""
    names: list[str] = []
    for config in configs:
        for name in config:
            if name not in names and name not in IGNORED_OPTIONS:
                names.append(name)

    def key(value: Any) -> str:
        return json.dumps(value, sort_keys=True, default=str)

    return [n for n in names if len({key(c.get(n)) for c in configs}) > 1]


def unique_labels(paths: list[Path]) -> list[str]:
    """Run directory names, made unique (``name``, ``name (2)``)."""
    labels: list[str] = []
    for path in paths:
        base = path.name or str(path)
        label, n = base, 2
        while label in labels:
            label, n = f"{base} ({n})", n + 1
        labels.append(label)
    return labels


def comparison_rows(runs: list[RunFacts]) -> list[tuple[str, list[str]]]:
    """(row name, one cell per run): the differing options first, then the outcomes."""
    rows: list[tuple[str, list[str]]] = []
    options = differing_options([r.config for r in runs])
    for name in options:
        rows.append(
            (f"--{name.replace('_', '-')}", [_option_text(r.config.get(name)) for r in runs])
        )
    if not options:
        rows.append(("options", ["the same" for _ in runs]))

    def best(r: RunFacts) -> str:
        b = r.best
        if b is None:
            return "--"
        return fmt_num(b[0]) + (f" (epoch {b[1]})" if b[1] is not None else "")

    rows += [
        ("outcome", [r.outcome for r in runs]),
        ("final accuracy", [fmt_num(r.final_accuracy) for r in runs]),
        ("best accuracy", [best(r) for r in runs]),
        ("time", [fmt_duration(r.duration_s) for r in runs]),
        # The bench's steady state (see benchmath), not the mean over the run that the run's
        # own summary and last line give: the two differ, and the row says which it is. With
        # the run's own interval, as the bench shows it: two figures 17 % apart from runs of
        # ±24 % each are no difference to act on.
        ("steady samples/s", [benchmath.rate_text(r.rate) for r in runs]),
        # Each run's against the first's, and whether the two intervals are apart.
        (
            "vs the first",
            ["--", *(benchmath.difference_text(r.rate, runs[0].rate) for r in runs[1:])],
        ),
        ("failure", [r.failure or "--" for r in runs]),
        ("restarts", ["--" if r.restarts is None else str(r.restarts) for r in runs]),
    ]
    if any(r.state.lines_unread for r in runs):  # what a replay would say: the run is not whole
        unread = [r.state.lines_unread for r in runs]
        rows.append(("unread lines", [f"{n:,} left out" if n else "--" for n in unread]))
    return rows


def _clip(text: str, width: int = MAX_CELL) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def format_comparison(runs: list[RunFacts]) -> list[str]:
    """The console table: one column per run."""
    header = ["", *(r.label for r in runs)]
    body = [[name, *cells] for name, cells in comparison_rows(runs)]
    table = [[_clip(c) for c in row] for row in [header, *body]]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = []
    for n, row in enumerate(table):
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    if benchmath.any_without_interval(r.rate for r in runs):
        lines.append(benchmath.no_interval_line())
    return lines


def load_all(run_dirs: list[str]) -> list[RunFacts]:
    if len(run_dirs) < 2:
        raise UsageError("compare needs at least two run directories")
    if len(run_dirs) > MAX_RUNS:
        raise UsageError(f"compare takes at most {MAX_RUNS} run directories, got {len(run_dirs)}")
    runs = [load_facts(d) for d in run_dirs]
    for run, label in zip(runs, unique_labels([r.path for r in runs]), strict=True):
        run.label = label
    return runs


def run(
    args: argparse.Namespace,
    out: TextIO | None = None,
    dashboard: Callable[[list[RunFacts]], int] | None = None,
) -> int:
    """``ddptui compare``: the runs side by side, in ``dashboard`` (the front end's compare
    screen) unless ``--no-ui`` or none is given, else as a table on ``out``."""
    try:
        runs = load_all(list(args.run_dirs))
    except (RunDirError, UsageError) as exc:
        return fail(str(exc))
    if args.no_ui or dashboard is None:
        out = out or sys.stdout
        out.write("\n".join(format_comparison(runs)) + "\n")
        return 0
    if no_terminal():
        return fail(no_terminal())
    return dashboard(runs)


if __name__ == "__main__":
    sys.exit(main())
