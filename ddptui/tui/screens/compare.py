"""``ddptui compare`` in the dashboard: the side-by-side table, and the runs' loss and accuracy
curves overlaid on one chart each (one color per run)."""

from __future__ import annotations

import math
from typing import Any

from rich.table import Table
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import Footer, Static
from textual_plotext import PlotextPlot

from ddptui.formatting import printable
from ddptui.runs.compare import RunFacts, comparison_rows
from ddptui.tui.model import chart_data
from ddptui.tui.widgets.charts import RANK_COLORS
from ddptui.tui.widgets.text import as_text


def run_color(i: int) -> str:
    return RANK_COLORS[i % len(RANK_COLORS)]


class OverlayChart(PlotextPlot):
    """One series per run on shared axes; drawn once (the runs do not change)."""

    def __init__(
        self,
        title: str,
        series: list[tuple[str, list[float], list[float]]],
        whole_x: bool = False,
        **kw: Any,
    ):
        super().__init__(**kw)
        self.title = title
        self.series = series
        self.whole_x = whole_x  # x is a count (epochs): ticks on whole numbers only

    def on_mount(self) -> None:
        plt = self.plt
        plt.clear_figure()
        drawn = False
        for i, (label, xs, ys) in enumerate(self.series):
            if not xs:
                continue
            drawn = True
            color = run_color(i)
            if len(xs) > 1:
                plt.plot(xs, ys, label=label, marker="braille", color=color)
            else:
                plt.scatter(xs, ys, label=label, marker="●", color=color)
        xs = [x for _, series_x, _ in self.series for x in series_x]
        if self.whole_x and xs:
            last = int(max(xs))
            plt.xlim(0.5, last + 0.5)
            plt.xticks(list(range(1, last + 1)))
        plt.title(self.title if drawn else f"{self.title} — no data")
        self.refresh()


def _loss_series(runs: list[RunFacts]) -> list[tuple[str, list[float], list[float]]]:
    out = []
    for run in runs:
        xs, ys = chart_data(run.state).mean_loss
        kept = [(x, y) for x, y in zip(xs, ys, strict=True) if math.isfinite(y)]
        out.append((printable(run.label, False), [x for x, _ in kept], [y for _, y in kept]))
    return out


def _accuracy_series(runs: list[RunFacts]) -> list[tuple[str, list[float], list[float]]]:
    out = []
    for run in runs:
        xs, ys = chart_data(run.state).accuracy
        kept = [(x, y) for x, y in zip(xs, ys, strict=True) if math.isfinite(y)]
        out.append((printable(run.label, False), [x for x, _ in kept], [y for _, y in kept]))
    return out


def comparison_table(runs: list[RunFacts]) -> Table:
    table = Table(expand=True, show_edge=False, pad_edge=False, header_style="bold")
    table.add_column("", style="dim", no_wrap=True)
    for i, run in enumerate(runs):
        table.add_column(as_text(run.label, style=f"bold {run_color(i)}"), overflow="fold")
    for name, cells in comparison_rows(runs):  # runs' names and values from their files
        table.add_row(name, *(as_text(c) if isinstance(c, str) else c for c in cells))
    return table


class CompareScreen(Screen):
    """The runs' table above their overlaid loss and accuracy charts."""

    BINDINGS = [Binding("q", "app.quit", "Quit")]

    DEFAULT_CSS = """
    CompareScreen #compare-title { height: 1; padding: 0 1; text-style: bold; }
    CompareScreen #compare-table { height: auto; max-height: 50%; padding: 0 1; }
    CompareScreen #compare-charts { height: 1fr; }
    CompareScreen OverlayChart { width: 1fr; height: 1fr; }
    """

    def __init__(self, runs: list[RunFacts]) -> None:
        super().__init__()
        self.runs = runs

    def compose(self) -> ComposeResult:
        yield Static(f"comparing {len(self.runs)} runs", id="compare-title")
        yield Static(comparison_table(self.runs), id="compare-table")
        with Horizontal(id="compare-charts"):
            yield OverlayChart("loss per step (mean of ranks)", _loss_series(self.runs))
            yield OverlayChart("eval accuracy per epoch", _accuracy_series(self.runs), whole_x=True)
        yield Footer()


class CompareApp(App[int]):
    TITLE = "ddptui compare"

    def __init__(self, runs: list[RunFacts], **kw: Any) -> None:
        super().__init__(**kw)
        self.runs = runs

    def on_mount(self) -> None:
        self.push_screen(CompareScreen(self.runs))


def run_compare(runs: list[RunFacts]) -> int:
    code = CompareApp(runs).run()
    return code if isinstance(code, int) else 0
