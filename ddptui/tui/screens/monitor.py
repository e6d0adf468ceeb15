"""``ddptui monitor``: GPUs and host, nvitop-like — per-GPU bars and history, processes
with their rank labels. Drawn from the app's SystemFeed (the monitor layer's Sampler)."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from ddptui.tui.widgets.system import GpuList, HostLine, ProcessTable, history_legend
from ddptui.tui.widgets.text import printable_text


class MonitorScreen(Screen):
    """Standalone (``ddptui monitor``) or opened from a run (then its ranks are labelled)."""

    BINDINGS = [
        Binding("escape,b", "leave", "Back"),
        Binding("q", "app.quit", "Quit"),
    ]

    def __init__(self, refresh_hz: float = 1.0, standalone: bool = True) -> None:
        super().__init__()
        self.refresh_hz = refresh_hz
        self.standalone = standalone

    def compose(self) -> ComposeResult:
        yield Static(id="monitor-title")
        with VerticalScroll(id="monitor-body"):
            yield HostLine(id="monitor-host", classes="wide")
            yield GpuList(wide=True, id="monitor-gpus")
        yield Static("processes", classes="panel-title")
        yield ProcessTable(id="monitor-procs")
        yield Footer()

    def on_mount(self) -> None:
        self.app.feed.start()
        self.refresh_view()
        self.set_interval(1 / self.refresh_hz, self.refresh_view, name="refresh-monitor")

    def refresh_view(self) -> None:
        feed = self.app.feed
        changed = feed.tick()
        if self.standalone:
            feed.track_gpu_processes()
        snap = feed.snapshot
        if snap is None:
            self.query_one("#monitor-title", Static).update(Text("sampling…", style="dim"))
            return
        if not changed and self.query_one(ProcessTable).row_count:
            return
        title = Text.assemble(("ddptui monitor", "bold"), "  ", snap.gpu.summary)
        if snap.gpu.available and snap.gpu.driver_version:
            title.append(f"  driver {snap.gpu.driver_version}", "dim")
        title.append(f"  history: {history_legend(feed.interval)}", "dim")
        self.query_one("#monitor-title", Static).update(printable_text(title))  # NVML's words
        self.query_one(HostLine).show(feed, wide=True)
        self.query_one(GpuList).show(feed)
        self.query_one(ProcessTable).show(feed)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return not (action == "leave" and self.standalone)

    def action_leave(self) -> None:
        self.app.close_monitor()
