"""``ddptui bench`` in the dashboard: the matrix with each configuration's state and figures,
overall progress, the run in progress, and a bar chart of samples/s per configuration.

The bench runs on a worker thread, one run at a time, exactly as headless (the same
:class:`~ddptui.runs.bench.BenchRunner`); quitting stops the run in progress and keeps what was
measured (bench.csv and bench.md are written either way).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from rich.table import Table
from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, ProgressBar, Static
from textual_plotext import PlotextPlot

from ddptui.formatting import fmt_duration, printable
from ddptui.runs.bench import BenchOptions, BenchRunner, Cancelled, Row
from ddptui.runs.bench_report import about_lines, no_interval_note, table_cells, write_results
from ddptui.tui.model import NARROW_BELOW
from ddptui.tui.widgets.text import as_text

#: The table's columns (the cells of :meth:`BenchScreen.table_rows`) and each one's share of
#: the width: every column gets its share, whatever its cells hold (sized by their cells, an
#: unstable figure's note, "7,387 no interval unstable", pushed the accuracy column off an
#: 80-column screen and cut the state to "mea…"). The state has a fixed width.
TABLE_COLUMNS = {
    "configuration": 4,
    "state": 0,
    "samples/s": 4,
    "efficiency": 4,
    "first step": 2,
    "peak RSS/rank": 2,
    "accuracy / why not": 3,
}
STATE_WIDTH = len("measured")
#: The columns a narrow terminal leaves to bench.md.
NARROW_DROP = {"first step", "peak RSS/rank"}

STATUS_STYLE = {
    "measured": "green",
    "skipped": "dim",
    "failed": "bold red",
    "interrupted": "yellow",
    "running": "bold cyan",
    "waiting": "",
}


class SamplesChart(PlotextPlot):
    """Horizontal bars: steady-state samples/s of each measured configuration."""

    def show(self, rows: list[Row]) -> None:
        plt = self.plt
        plt.clear_figure()
        measured = [r for r in rows if r.rate is not None]
        if not measured:
            plt.title("samples/s per configuration — nothing measured yet")
        else:
            labels = [r.planned.label for r in measured]
            values = [r.rate.median for r in measured]  # type: ignore[union-attr]
            colors = [
                "green" if r.fastest else ("cyan" if r.stable else "yellow") for r in measured
            ]
            plt.bar(labels, values, orientation="horizontal", color=colors, width=0.4)
            plt.title("steady-state samples/s (green: fastest, yellow: unstable)")
        self.refresh()


class BenchScreen(Screen):
    BINDINGS = [Binding("q", "stop_bench", "Stop and quit")]

    DEFAULT_CSS = """
    BenchScreen #bench-title { height: auto; padding: 0 1; }
    BenchScreen #bench-progress-row { height: 1; padding: 0 1; }
    BenchScreen #bench-now { height: auto; max-height: 4; padding: 0 1; color: $text-muted; }
    BenchScreen #bench-table { height: auto; max-height: 60%; padding: 0 1; }
    BenchScreen SamplesChart { height: 1fr; min-height: 8; }
    """

    @dataclass
    class Done(Message):
        code: int
        error: str | None

    def __init__(self, opts: BenchOptions, **measure_kwargs: Any) -> None:
        super().__init__()
        self.opts = opts
        self.runner = BenchRunner(opts, **measure_kwargs)
        self.cancel = threading.Event()
        self.done = threading.Event()
        self.current: tuple[int, Any] | None = None  # (config index, its RunState)
        self.finished_runs = 0
        self.code = 0
        self.error: str | None = None
        todo = self.runner.runnable
        self.total = len(todo) * opts.repeat

    def compose(self) -> ComposeResult:
        skipped = len(self.opts.plan) - len(self.runner.runnable)
        yield Static(
            Text.assemble(
                ("ddptui bench ", "bold"),
                f"{len(self.opts.plan)} configurations, {len(self.runner.runnable)} to run "
                f"× {self.opts.repeat}, {skipped} skipped -> {self.opts.bench_dir}",
            ),
            id="bench-title",
        )
        yield ProgressBar(total=max(1, self.total), show_eta=False, id="bench-progress-row")
        yield Static("", id="bench-now")
        yield Static("", id="bench-table")
        yield SamplesChart()
        yield Footer()

    def on_mount(self) -> None:
        self._run()
        self.set_interval(0.5, self.redraw, name="bench-redraw")
        self.redraw()

    # -- the worker --------------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="bench", exit_on_error=False)
    def _run(self) -> None:
        runner = self.runner
        runner.measure_kwargs["cancelled"] = self.cancel.is_set
        try:
            for res, repeat in runner.jobs():
                if self.cancel.is_set():
                    raise Cancelled
                index = runner.results.index(res)

                def progress(state: Any, index: int = index) -> None:
                    self.current = (index, state)

                runner.measure_kwargs["on_progress"] = progress
                self.current = (index, None)
                runner.run_config(res, repeat)
                self.finished_runs += 1
                if self.finished_runs >= self.total:  # --until-stable: runs beyond the plan
                    self.total = self.finished_runs + 1
            self.total = self.finished_runs  # every run done: a full bar (it stood at 2/3)
        except Cancelled:
            self.code = 130
        except Exception as exc:  # a run directory that cannot be written, a bug: say so
            self.error = f"{type(exc).__name__}: {exc}"
            self.code = 1
        finally:
            self.current = None
            rows = runner.rows()
            if self.code == 0 and any(r.status in ("failed", "interrupted") for r in rows):
                self.code = 1
            try:
                write_results(self.opts.bench_dir, rows, about_lines(self.opts))
            except Exception as exc:
                self.error = self.error or str(exc)
                self.code = self.code or 1
            self.done.set()
            self.post_message(self.Done(self.code, self.error))

    # -- drawing -----------------------------------------------------------------------------
    def _status(self, index: int, row: Row) -> str:
        current = self.current
        if current is not None and current[0] == index:
            return "running"
        if row.status == "not run":
            return "waiting"
        return row.status

    def table_rows(self, rows: list[Row]) -> list[tuple[str, ...]]:
        """The table's cells: configuration, state, samples/s, efficiency, first step, peak
        RSS per rank, and the accuracy (or why the configuration was not measured)."""
        out = []
        for index, row in enumerate(rows):
            cells = table_cells(row)
            status = self._status(index, row)
            if status in ("waiting", "running"):
                last = ""
            elif row.status != "measured" or row.reason:
                last = row.reason
            else:
                last = cells[6]
            out.append((cells[0], status, *cells[1:5], last))
        return out

    def redraw(self) -> None:
        rows = self.runner.rows()
        table = Table(expand=True, show_edge=False, pad_edge=False, header_style="bold")
        # Under NARROW_BELOW columns the first step and the peak RSS are left to bench.md:
        # at 80 every column was cut to a few characters ("5,767 no interval …").
        narrow = 0 < self.size.width < NARROW_BELOW
        keep = []  # the cells' indices of the columns shown
        for i, (name, share) in enumerate(TABLE_COLUMNS.items()):
            if narrow and name in NARROW_DROP:
                continue
            keep.append(i)
            width = None if share else STATE_WIDTH
            table.add_column(name, no_wrap=True, ratio=share or None, width=width)
        for cells in self.table_rows(rows):
            status = Text(cells[1], style=STATUS_STYLE.get(cells[1], ""))
            table.add_row(*(status if i == 1 else as_text(cells[i]) for i in keep))
        self.query_one("#bench-table", Static).update(table)
        self.query_one(ProgressBar).update(total=max(1, self.total), progress=self.finished_runs)
        self.query_one("#bench-now", Static).update(self.now_line())
        self.query_one(SamplesChart).show(rows)

    def now_line(self) -> str:
        if self.done.is_set():
            verdict = {0: "done", 130: "stopped"}.get(self.code, "done, with failures")
            tail = f": {self.error}" if self.error else ""
            measured = [r for r in self.runner.rows() if r.status == "measured"]
            notes = "".join(f"\n{note}" for note in no_interval_note(measured))
            return f"bench {verdict}{tail} — results in {self.opts.bench_dir} (q quits){notes}"
        current = self.current
        if current is None:
            return "starting…"
        index, state = current
        label = self.runner.results[index].planned.label
        if state is None:
            return f"run {self.finished_runs + 1}/{self.total}: {label}: launching…"
        step = min((v.step for v in state.ranks.values()), default=0)
        goal = f"/{self.opts.steps}" if self.opts.steps is not None else ""
        return (
            f"run {self.finished_runs + 1}/{self.total}: {label}: step {step}{goal}, "
            f"{state.global_samples_per_s():,.0f} samples/s, "
            f"{fmt_duration(state.elapsed(state.last_event_at or 0.0))}"
        )

    def on_bench_screen_done(self, message: Done) -> None:
        self.redraw()
        if message.error:
            self.notify(printable(message.error), severity="error", title="bench", markup=False)
        if self.cancel.is_set():
            self.app.exit(message.code)

    def action_stop_bench(self) -> None:
        if self.done.is_set():
            self.app.exit(self.code)
            return
        self.cancel.set()
        self.notify("stopping the run in progress…", title="bench")


class BenchApp(App[int]):
    TITLE = "ddptui bench"

    def __init__(self, opts: BenchOptions, **measure_kwargs: Any) -> None:
        super().__init__()
        self.bench_screen = BenchScreen(opts, **measure_kwargs)

    def on_mount(self) -> None:
        self.push_screen(self.bench_screen)


def run_bench_dashboard(opts: BenchOptions) -> int:
    app = BenchApp(opts)
    try:
        code = app.run()
    finally:
        screen = app.bench_screen
        screen.cancel.set()  # however the app ended, no run may outlive it
        screen.done.wait(60)
    return code if isinstance(code, int) else screen.code
