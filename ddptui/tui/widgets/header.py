"""The run screen's header: what is running, its state, elapsed, ETA and epoch progress."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import ProgressBar

from ddptui.formatting import target_label
from ddptui.tui.model import RunFrame, setup_label
from ddptui.tui.widgets.text import QuietStatic

#: Style of each run status in the header.
STATUS_STYLE = {
    "starting": "bold yellow",
    "running": "bold green",
    "failing": "bold red",
    "failed": "bold white on red",
    "finished": "bold green",
    "stopped": "bold yellow",
}


class RunHeader(Vertical):
    """Run id, trainer, launcher, backend, AMP, device, world size, state, elapsed, ETA,
    progress."""

    def compose(self) -> ComposeResult:
        yield QuietStatic(id="run-title")
        with Horizontal(id="run-progress-row"):
            yield QuietStatic(id="run-epoch")
            yield ProgressBar(total=1.0, show_eta=False, id="run-progress")
            yield QuietStatic(id="run-timing")
        yield QuietStatic(id="run-summary")

    def on_mount(self) -> None:
        # Looked up once: show() runs several times a second.
        self._title = self.query_one("#run-title", QuietStatic)
        self._epoch = self.query_one("#run-epoch", QuietStatic)
        self._bar = self.query_one("#run-progress", ProgressBar)
        self._timing = self.query_one("#run-timing", QuietStatic)
        self._summary = self.query_one("#run-summary", QuietStatic)

    def show(self, frame: RunFrame, config: dict[str, Any], note: str = "") -> None:
        title = Text.assemble(
            ("run ", "dim"),
            (str(config.get("run_id") or "?"), "bold"),
            "  ",
            (target_label(config), "bold cyan"),
            "  ",
            setup_label(config, [row.device for row in frame.rows], len(frame.rows)) + "  ",
            (f" {frame.status.upper()} ", STATUS_STYLE.get(frame.status, "bold")),
        )
        if frame.attempt:
            title.append(f"  {frame.attempt}", "bold magenta")
        if note:
            title.append(f"  {note}", "italic yellow")
        self._title.show_text(title)
        self._epoch.show_text(f"epoch {frame.epoch}")
        bar = self._bar
        shown = frame.progress is not None  # unknown epoch count: no bar to fill
        if bar.display != shown:
            bar.display = shown
            # No bar: the timing takes its room (its ETA may say "-- (epochs unknown)").
            self.set_class(not shown, "-no-progress")
        if frame.progress is not None and bar.progress != frame.progress:
            bar.update(total=1.0, progress=frame.progress)
        ended = frame.status in ("finished", "failed", "stopped")
        self._timing.show_text(f"elapsed {frame.elapsed}" + ("" if ended else f"  ETA {frame.eta}"))
        self._summary.show_text(frame.summary)
