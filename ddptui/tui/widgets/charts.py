"""Run charts drawn with plotext (textual-plotext): loss per step, eval accuracy per epoch,
global samples/s. Each chart redraws only when its data changed."""

from __future__ import annotations

import math
from typing import Any

from rich.cells import cell_len
from textual.app import RenderResult
from textual_plotext import PlotextPlot

from ddptui.tui.model import ChartData

#: Line colors for per-rank loss (plotext color names), cycled for more ranks.
RANK_COLORS = ("cyan", "orange", "green", "magenta", "yellow", "blue", "red", "white")


class _Chart(PlotextPlot):
    """Replots (and refreshes) only when ``signature`` of the new data differs."""

    title = ""

    def on_mount(self) -> None:
        self._signature: Any = None
        self._titles: tuple[str, ...] = ()
        self._plot_empty()

    def set_title(self, *titles: str) -> None:
        """The chart's title: the first of ``titles`` (longest first) that fits its width
        when drawn. plotext leaves out a title wider than the plot: at 120 columns the
        accuracy chart's hint (80 characters in a 38-column chart) left an empty box with
        no word of what it was."""
        self._titles = titles

    def render(self) -> RenderResult:
        if self._titles:
            self.plt.title(fit_title(self._titles, self.size.width))
        return super().render()

    def _plot_empty(self, message: str = "no data yet") -> None:
        plt = self.plt
        plt.clear_figure()
        short = message.split(" (", 1)[0]  # the hint in parentheses left out where it must
        self.set_title(f"{self.title} — {message}", f"{self.title} — {short}", self.title)
        self.refresh()

    def show(self, data: ChartData) -> None:
        signature = self.signature(data)
        if signature == self._signature:
            return
        self._signature = signature
        plt = self.plt
        plt.clear_figure()
        self.set_title(self.title)
        if not self.draw(data):
            self._plot_empty(self.empty_message(data))
            return
        self.refresh()

    def empty_message(self, data: ChartData) -> str:
        """What the chart says while it has nothing to draw."""
        return "no data yet"

    def signature(self, data: ChartData) -> Any:  # pragma: no cover - overridden
        raise NotImplementedError

    def draw(self, data: ChartData) -> bool:  # pragma: no cover - overridden
        raise NotImplementedError


def fit_title(titles: tuple[str, ...], width: int) -> str:
    """The first of ``titles`` no wider than ``width`` cells, else the last (the shortest)."""
    return next((title for title in titles if cell_len(title) <= width), titles[-1])


def _tail_signature(xs: list[float], ys: list[float]) -> tuple:
    return (len(xs), xs[-1] if xs else None, ys[-1] if ys else None)


class LossChart(_Chart):
    """Training loss per step: the mean over ranks, or one line per rank."""

    title = "loss per step"

    def on_mount(self) -> None:
        self.per_rank = False
        super().on_mount()

    def set_per_rank(self, per_rank: bool) -> None:
        self.per_rank = per_rank
        self._signature = None  # force a redraw on the next show()

    def signature(self, data: ChartData) -> Any:
        if self.per_rank:
            return (
                "ranks",
                data.restarts,
                tuple((r, *_tail_signature(*xy)) for r, xy in data.loss_by_rank.items()),
            )
        return ("mean", data.restarts, *_tail_signature(*data.mean_loss))

    def draw(self, data: ChartData) -> bool:
        plt = self.plt
        for step in data.restarts:  # where each restarted attempt began
            plt.vline(step, "red")
        if self.per_rank:
            drawn = False
            for rank, (xs, ys) in data.loss_by_rank.items():
                if xs:
                    plt.plot(
                        xs,
                        ys,
                        label=f"rank {rank}",
                        marker="braille",
                        color=RANK_COLORS[rank % len(RANK_COLORS)],
                    )
                    drawn = True
            self.set_title("loss per step, per rank", "loss, per rank")
            return drawn
        xs, ys = data.mean_loss
        if not xs:
            return False
        plt.plot(xs, ys, marker="braille", color="cyan")
        restarts = f", {len(data.restarts)} restarts (red)" if data.restarts else ""
        self.set_title(f"loss per step (mean of ranks){restarts}", f"loss{restarts}", "loss")
        return True


class AccuracyChart(_Chart):
    """Evaluation accuracy after each epoch."""

    title = "eval accuracy"

    def signature(self, data: ChartData) -> Any:
        return (
            data.epochs,
            data.no_eval,
            tuple(zip(*data.accuracy, strict=True)),
            tuple(zip(*data.eval_loss, strict=True)) if not data.accuracy[0] else (),
        )

    def empty_message(self, data: ChartData) -> str:
        if data.no_eval:
            return "none reported (ddptui.log_eval(epoch=…, accuracy=…) reports one)"
        return "no data yet"

    def draw(self, data: ChartData) -> bool:
        """The accuracy per epoch; the evaluations' loss when none carries an accuracy (the
        HF Trainer's ``eval_loss`` without ``compute_metrics``)."""
        epochs, values = data.accuracy
        what = "accuracy"
        if not epochs:
            epochs, values = data.eval_loss
            what = "loss"
            if not epochs:
                return False
        plt = self.plt
        if len(epochs) > 1:
            plt.plot(epochs, values, marker="braille", color="green")
        plt.scatter(epochs, values, marker="●", color="green")
        first = min(1, math.floor(min(epochs)))  # epochs counted from 0 (accelerate's passes)
        last = max(data.epochs or 0, int(max(epochs)))
        plt.xlim(first - 0.5, last + 0.5)
        plt.xticks(list(range(first, last + 1)))
        if what == "accuracy":
            limits = accuracy_limits(values)
            if limits is not None:
                plt.ylim(*limits)
        self.set_title(f"eval {what} per epoch: {values[-1]:.4f}", f"{what} {values[-1]:.4f}")
        return True


def accuracy_limits(values: list[float]) -> tuple[float, float] | None:
    """The y range of an accuracy chart: up to 1 for fractions, up to 100 for percentages
    (accelerate's complete_cv_example logs ``100 * accuracy``: its 25.0, 16.7 and 58.3 were
    drawn in a range of 16.6 down to 1.0, only one point in view), zoomed to the nearest tenth
    of that below the lowest value, where runs differ; None (plotext's own range) for values
    beyond 100 or none finite."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite or max(finite) > 100.0:
        return None
    top = 1.0 if max(finite) <= 1.0 else 100.0
    tenth = top / 10
    low = math.floor((min(finite) - top * 0.05) / tenth) * tenth
    return (max(0.0, low) if min(finite) >= 0.0 else low), top


class ThroughputChart(_Chart):
    """Global samples/s (all ranks) over time."""

    title = "global samples/s"

    def signature(self, data: ChartData) -> Any:
        return _tail_signature(*data.throughput)

    def draw(self, data: ChartData) -> bool:
        xs, ys = data.throughput
        if not xs:
            return False
        plt = self.plt
        plt.plot(xs, ys, marker="braille", color="orange")
        plt.xlabel("seconds")
        plt.ylim(0, max(ys) * 1.1 or 1)
        return True
