"""``ddptui bench``'s results as text: the table, ``bench.csv`` and ``bench.md`` (shared with
the dashboard's bench screen), and the console command: progress lines while the matrix runs,
the table at the end. Planning and measuring are :mod:`ddptui.runs.bench`.

Headless: never imports Textual (the dashboard is passed in by the front end).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import io
import socket
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from ddptui import safeio
from ddptui.commands import UsageError, command_main, fail, no_terminal
from ddptui.formatting import fmt_duration
from ddptui.rank.cpus import usable_cpus
from ddptui.run.options import ConfigError
from ddptui.run.rundir import RunDirError
from ddptui.run.signals import Interrupted, signals_deferred, signals_interrupt
from ddptui.runs import benchmath
from ddptui.runs.bench import (
    CSV_FILE,
    MD_FILE,
    BenchOptions,
    BenchRunner,
    Measurement,
    Row,
    _run_figure,
    add_arguments,
    plan_bench,
)

#: Seconds between progress lines (when not on a terminal).
PROGRESS_EVERY_S = 5.0
MiB = 1024 * 1024


CSV_COLUMNS = (
    "configuration",
    "world_size",
    "launcher",
    "backend",
    "amp",
    "status",
    "reason",
    "repeats",
    "samples_per_s",
    "samples_per_s_min",
    "samples_per_s_max",
    "spread_pct",
    "stable",
    "interval_from",
    "efficiency",
    "efficiency_note",
    "time_to_first_step_s",
    "peak_rss_mib_per_rank",
    "peak_rss_mib_max",
    "peak_gpu_mib_per_rank",
    "final_accuracy",
    "steps_per_rank",
    "fastest",
    "run_dirs",
)


def _mib(values: dict[int, int]) -> str:
    if not values:
        return "--"
    low, high = min(values.values()) / MiB, max(values.values()) / MiB
    return f"{high:,.0f} MiB" if round(low) == round(high) else f"{low:,.0f}–{high:,.0f} MiB"


def _pct(value: float | None) -> str:
    return "--" if value is None else f"{value:.0%}"


def _efficiency(row: Row) -> str:
    """The efficiency, or ``-- (why)`` when it was refused."""
    if row.efficiency is not None:
        return _pct(row.efficiency)
    if row.efficiency_note and row.efficiency_note != "not measured":
        return f"-- ({row.efficiency_note})"
    return "--"


def _acc(value: float | None) -> str:
    return "--" if value is None else f"{value:.4f}"


def _secs(value: float | None) -> str:
    return "--" if value is None else f"{value:.1f}s"


TABLE_HEADERS = (
    "configuration",
    "samples/s",
    "efficiency",
    "first step",
    "peak RSS/rank",
    "GPU mem/rank",
    "accuracy",
)


def table_cells(row: Row) -> tuple[str, ...]:
    return (
        row.planned.label + (" *" if row.fastest else ""),
        benchmath.rate_text(row.rate),
        _efficiency(row),
        _secs(row.time_to_first_step),
        _mib(row.rss),
        _mib(row.gpu),
        _acc(row.accuracy),
    )


def no_interval_note(measured: Sequence[Row]) -> list[str]:
    """Why a figure says ``no interval``, and how to get one: a line, where one does."""
    if not benchmath.any_without_interval(r.rate for r in measured):
        return []
    need = benchmath.steps_for_interval()
    how = f"; run longer (--steps {need} or more) or --repeat 2 or more"
    return [benchmath.no_interval_line() + how]


def format_table(rows: Sequence[Row]) -> list[str]:
    """The console table: measured configurations, then the others with why."""
    shown = [r for r in rows if r.status == "measured"]
    lines: list[str] = []
    if shown:
        cells = [TABLE_HEADERS, *(table_cells(r) for r in shown)]
        widths = [max(len(c[i]) for c in cells) for i in range(len(TABLE_HEADERS))]
        for n, line in enumerate(cells):
            parts = [line[0].ljust(widths[0])]
            parts += [c.rjust(w) for c, w in zip(line[1:], widths[1:], strict=True)]
            lines.append("  ".join(parts).rstrip())
            if n == 0:
                lines.append("  ".join("-" * w for w in widths))
        lines.append("* fastest")
        lines += no_interval_note(shown)
    else:
        lines.append("no configuration was measured")
    notes = [r for r in shown if r.reason]
    if notes:
        lines.append("notes:")
        lines += [f"  {r.planned.label}: {r.reason}" for r in notes]
    others = [r for r in rows if r.status != "measured"]
    if others:
        lines.append("not measured:")
        lines += [f"  {r.planned.label}: {r.status}: {r.reason}" for r in others]
    return lines


def csv_text(rows: Sequence[Row]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)

    def num(value: float | None, digits: int = 3) -> str:
        return "" if value is None else f"{value:.{digits}f}"

    for r in rows:
        p = r.planned
        rate = r.rate
        writer.writerow(
            (
                p.label,
                "" if p.world_size is None else p.world_size,
                p.launcher,
                p.backend,
                p.amp,
                r.status,
                r.reason,
                rate.count if rate else 0,
                num(rate.median if rate else None, 1),
                num(rate.low if rate else None, 1),
                num(rate.high if rate else None, 1),
                num(100 * rate.half_width if rate and rate.half_width is not None else None, 1),
                "" if rate is None else ("true" if rate.stable else "false"),
                "" if rate is None else rate.source,
                num(r.efficiency),
                r.efficiency_note,
                num(r.time_to_first_step),
                " ".join(f"{r.rss[k] / MiB:.0f}" for k in sorted(r.rss)),
                num(max(r.rss.values()) / MiB if r.rss else None, 0),
                " ".join(f"{r.gpu[k] / MiB:.0f}" for k in sorted(r.gpu)),
                num(r.accuracy, 4),
                "" if r.steps is None else r.steps,
                "yes" if r.fastest else "",
                ";".join(str(d) for d in r.run_dirs),
            )
        )
    return buf.getvalue()


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_text(rows: Sequence[Row], heading: str, about: Sequence[str]) -> str:
    lines = [f"# {heading}", "", *about, ""]
    measured = [r for r in rows if r.status == "measured"]
    if measured:
        lines.append("| " + " | ".join(TABLE_HEADERS) + " |")
        lines.append("|" + "|".join(["---"] + ["---:"] * (len(TABLE_HEADERS) - 1)) + "|")
        for r in measured:
            cells = [_md_escape(c) for c in table_cells(dataclasses.replace(r, fastest=False))]
            if r.fastest:
                cells = [f"**{c}**" if c != "--" else c for c in cells]
                cells[0] += " \\*"
            lines.append("| " + " | ".join(cells) + " |")
        lines += ["", "\\* fastest", ""]
        for note in no_interval_note(measured):  # a paragraph of its own
            lines += [note, ""]
    others = [r for r in rows if r.status != "measured"]
    if others:
        lines.append("Not measured:")
        lines.append("")
        for r in others:
            lines.append(f"- {_md_escape(r.planned.label)}: {r.status}: {_md_escape(r.reason)}")
        lines.append("")
    return "\n".join(lines)


def about_lines(opts: BenchOptions) -> list[str]:
    length = f"{opts.steps} steps" if opts.steps is not None else f"{opts.epochs} epochs"
    repeat = "1 run" if opts.repeat == 1 else f"median of {opts.repeat} runs"
    if opts.until_stable is not None:
        repeat += f", unstable ones repeated for up to {opts.until_stable:.0f} s more"
    return [
        f"{opts.target}, {length} per configuration, {repeat}, on {usable_cpus()} CPU cores "
        f"and {opts.devices or 'no GPU'} of {_hostname()}.",
        f"samples/s: steady state, all ranks together; each rank's first "
        f"max({benchmath.MIN_WARMUP_STEPS}, {benchmath.WARMUP_FRACTION:.0%}) steps and the "
        "first step of each later epoch excluded. ± is a "
        f"{benchmath.CONFIDENCE:.0%} interval: over the repeats (their range below five), or, "
        "for one run, over the rates of its windows of steps; wider than "
        f"±{benchmath.STABLE_SPREAD:.0%}: {benchmath.UNSTABLE}. "
        "efficiency: samples/s / (world size x "
        "samples/s at world size 1, same other options), only from two stable figures and "
        "never above what the cores can give (else -- and why). first step: launch to the "
        "first step. Memory: peak per rank (its process tree).",
    ]


def _hostname() -> str:
    return socket.gethostname()


def write_results(bench_dir: Path, rows: Sequence[Row], about: Sequence[str]) -> None:
    try:
        bench_dir.mkdir(parents=True, exist_ok=True)
        csv_doc, md_doc = csv_text(rows), markdown_text(rows, "ddptui bench", about)
        safeio.write_output(bench_dir / CSV_FILE, lambda f: f.write(csv_doc))
        safeio.write_output(bench_dir / MD_FILE, lambda f: f.write(md_doc))
    except OSError as exc:
        raise RunDirError(
            f"cannot write {safeio.shown(bench_dir)}: {exc.strerror or exc}"
        ) from None


def _describe(m: Measurement) -> str:
    if not m.ok:
        return m.problem or "not measured"
    parts = [
        f"{benchmath.rate_text(_run_figure(m))} samples/s",
        f"first step {_secs(m.time_to_first_step)}",
    ]
    if m.accuracy is not None:
        parts.append(f"accuracy {m.accuracy:.4f}")
    if m.note:
        parts.append(m.note)
    return ", ".join(parts)


class ProgressPrinter:
    """A progress line now and then while a configuration runs."""

    def __init__(self, out: TextIO, label: str, steps: int | None) -> None:
        self.out = out
        self.label = label
        self.steps = steps
        self.last = time.monotonic()

    def __call__(self, state: Any) -> None:
        now = time.monotonic()
        if now - self.last < PROGRESS_EVERY_S:
            return
        self.last = now
        views = list(state.ranks.values())
        step = min((v.step for v in views), default=0)
        goal = f"/{self.steps}" if self.steps is not None else ""
        self.out.write(
            f"    step {step}{goal}, {state.global_samples_per_s():,.0f} samples/s, "
            f"{fmt_duration(state.elapsed(now))}\n"
        )
        self.out.flush()


@contextmanager
def held_signals(guard: Any) -> Iterator[None]:
    """While tearing a run down, a signal is remembered, not raised; once the teardown is
    done it interrupts the bench (the rest of the matrix is not run)."""
    was, before = guard.armed, len(guard.received)
    guard.armed = False
    try:
        yield
    finally:
        guard.armed = was
    if was and len(guard.received) > before:
        guard.armed = False
        raise Interrupted(guard.received[-1])


def run(
    args: argparse.Namespace,
    out: TextIO | None = None,
    dashboard: Callable[[BenchOptions], int] | None = None,
) -> int:
    """``ddptui bench``: exit 0 when every runnable configuration was measured, 1 when one
    failed, 2 for bad options, 128 + signal when interrupted (results so far are written).

    ``dashboard``: the front end's bench screen, run with the plan unless ``--no-ui``; without
    it the bench runs here, printing progress lines and the table."""
    out = out or sys.stdout
    try:
        opts = plan_bench(args)
    except (ConfigError, UsageError) as exc:
        return fail(str(exc))
    if dashboard is not None and not args.no_ui:
        if no_terminal():
            return fail(no_terminal())
        return dashboard(opts)
    runner = BenchRunner(opts, starting=signals_deferred)
    todo = runner.runnable
    total = len(todo) * opts.repeat
    more = "+" if opts.until_stable is not None else ""
    out.write(
        f"ddptui bench: {len(opts.plan)} configurations ({len(todo)} to run, "
        f"{len(opts.plan) - len(todo)} skipped) -> {opts.bench_dir}\n"
    )
    for res in runner.results:
        if res.planned.skip:
            out.write(f"  skip {res.planned.label}: {res.planned.skip}\n")
    out.flush()
    code = 0
    n = 0
    with signals_interrupt() as guard:
        runner.measure_kwargs["tearing_down"] = lambda: held_signals(guard)
        try:
            for res, repeat in runner.jobs():
                n += 1
                label = res.planned.label
                out.write(f"[{n}/{total}{more}] {label}: running…\n")
                out.flush()
                runner.measure_kwargs["on_progress"] = ProgressPrinter(out, label, opts.steps)
                m = runner.run_config(res, repeat)
                out.write(f"[{n}/{total}{more}] {label}: {_describe(m)}\n")
                out.flush()
        except Interrupted as exc:
            guard.armed = False
            out.write(f"interrupted ({exc}): every run was stopped\n")
            code = 128 + exc.signum
        except RunDirError as exc:
            fail(str(exc))
            code = 1
        finally:
            guard.armed = False
    rows = runner.rows()
    if code == 0 and any(r.status in ("failed", "interrupted") for r in rows):
        code = 1
    out.write("\n" + "\n".join(format_table(rows)) + "\n")
    try:
        write_results(opts.bench_dir, rows, about_lines(opts))
    except RunDirError as exc:
        fail(str(exc))
        return code or 1
    out.write(f"results: {opts.bench_dir / CSV_FILE}, {opts.bench_dir / MD_FILE}\n")
    out.flush()
    return code


def main(argv: list[str] | None = None) -> int:
    return command_main("ddptui bench", __doc__ or "", add_arguments, run, argv, passthrough=True)


if __name__ == "__main__":
    sys.exit(main())
