"""The run screen: header, per-rank table, charts, system panel, logs, failure summary.

Drawing is pull-based and throttled: a timer at ``refresh_hz`` (4.5 Hz; at most 3 Hz beyond 64
ranks) copies what the header and table need out of the RunState (under the source's lock) and
updates the widgets; slower timers do the same for the charts (``chart_hz``, 0.5 Hz: plotext is
the costliest thing on screen) and for the phase bars, system panel and logs (``panel_hz``,
1 Hz). Events themselves never trigger a redraw, so 16 ranks at 50 steps/s cost about what 2
ranks at 1 step/s do. Each header and table refresh first has a live run's driving thread pump
what came since its last pump (``LiveSource.catch_up``): while a screen draws the run, that
thread pumps once a frame, so that the frame shows every event that came before it.
"""

from __future__ import annotations

import functools
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.css.scalar import Scalar
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer
from textual.worker import get_current_worker

from ddptui.formatting import printable
from ddptui.run.launcher import LaunchResult
from ddptui.runfiles import CHECKPOINT_FILE
from ddptui.tui.model import NARROW_BELOW, RunFrame, chart_data, run_frame
from ddptui.tui.node_system import NodeSystemLine, local_node, node_system_lines
from ddptui.tui.screens.confirm import ConfirmScreen
from ddptui.tui.sources import LiveSource, RunSource
from ddptui.tui.widgets.charts import AccuracyChart, LossChart, ThroughputChart
from ddptui.tui.widgets.failure import TAIL_LINES, FailurePanel, desync_line
from ddptui.tui.widgets.header import RunHeader
from ddptui.tui.widgets.logs import RankLogs
from ddptui.tui.widgets.phases import PhasePanel
from ddptui.tui.widgets.ranks import HealthLine, RankTable
from ddptui.tui.widgets.system import SystemPanel
from ddptui.tui.widgets.text import QuietStatic


def goes_on(draw: Callable[[RunScreen], None]) -> Callable[[RunScreen], None]:
    """A timer's drawing of the run screen whose error (ddptui's own bug) is said once, in a
    notification, and never raised: raised from a Textual timer it ended the app, and with
    it the run the screen watched."""

    @functools.wraps(draw)
    def drawn(screen: RunScreen) -> None:
        try:
            draw(screen)
        except Exception as exc:  # noqa: BLE001 - the run must outlive ddptui's own bug
            if draw.__name__ not in screen.draw_errors:
                error = screen.draw_errors[draw.__name__] = f"{type(exc).__name__}: {exc}"[:300]
                screen.notify(
                    f"ddptui's own error drawing the run ({printable(error)}): "
                    "the run goes on; this part of the screen may stand still. Please report it",
                    severity="error",
                    timeout=30,
                    markup=False,
                )

    return drawn


#: A run of more than this many ranks...
LARGE_RUN_RANKS = 64
#: ...refreshes its header and table at most this often. Hundreds of ranks stepping change
#: every visible line of the table at each refresh, a frame's cost grows with the ranks, and
#: three refreshes a second read as live as four and a half (256 ranks on 32 nodes: about
#: 1.5 % of a core less).
LARGE_RUN_HZ = 3.0
#: Lines the charts' row keeps at least (its CSS min-height): the rank table and the phase
#: panel share what the screen has left (see RunScreen.fit_heights).
CHARTS_MIN_LINES = 10
#: Most lines the rank table (with its header) and the phase panel take on a tall screen.
TABLE_MAX_LINES = 18
PHASES_MAX_LINES = 13
#: Fewest lines they keep on a short one: the table's header and four ranks; the phase
#: legend, one bar and a diagnosis.
TABLE_MIN_LINES = 5
PHASES_MIN_LINES = 3
#: A terminal narrower than NARROW_BELOW leaves the system panel out (the charts take its
#: columns; `g` opens the GPU monitor), and one shorter than this shows the loss chart alone,
#: with fewer log lines (app.tcss: ``RunScreen.-narrow``, ``RunScreen.-short``): at 80x24 the
#: run screen scrolled, its charts a few lines high.
SHORT_BELOW = 32
#: The least lines the charts' row keeps on a short screen (the loss chart alone); a short
#: screen that shows a failure drops the charts, and the failure panel shows the last
#: SHORT_TAIL_LINES lines of the rank's stderr (at most 8 lines in all).
SHORT_CHARTS_MIN_LINES = 6
SHORT_TAIL_LINES = 2


class RunScreen(Screen):
    """Shows one run from a :class:`RunSource`; drives it when it is a live one."""

    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (NARROW_BELOW, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (SHORT_BELOW, "-tall")]

    BINDINGS = [
        Binding("s", "stop_run", "Stop run"),
        Binding("r", "restart", "Restart"),
        Binding("b", "back", "Back to form"),
        Binding("l", "toggle_logs", "Logs"),
        Binding("f", "cycle_log_filter", "Log filter"),
        Binding("m", "toggle_loss", "Loss mean/ranks"),
        Binding("g", "monitor", "GPU monitor"),
        Binding("c", "collectives", "Collectives"),
        Binding("q", "app.quit", "Quit"),
    ]

    @dataclass
    class RunEnded(Message):
        """A live run has ended (finished, failed, stopped, or could not start)."""

        screen: RunScreen
        result: LaunchResult | None
        error: str | None

    @dataclass
    class RestartRequested(Message):
        """The user wants the same run again (the app builds and launches it)."""

        config: dict

    @dataclass
    class BackRequested(Message):
        """The user wants the launch form back."""

        screen: RunScreen

    def __init__(
        self,
        source: RunSource,
        refresh_hz: float = 4.5,
        chart_hz: float = 0.5,
        panel_hz: float = 1.0,
    ):
        super().__init__()
        self.source = source
        self.refresh_hz = refresh_hz
        self.chart_hz = chart_hz
        self.panel_hz = panel_hz
        self.frame: RunFrame | None = None
        self._view_hz = refresh_hz  # the header and table's rate now (see view_hz)
        self._after_end: str | None = None  # "restart" | "back" once the live run has ended
        #: Called after each header/table refresh with the frame drawn (benchmarks, tests).
        self.on_frame_drawn = None
        self._charted_events = -1
        self._chart_tick = 0
        self._redraw_timers: list = []
        self._chart_data = None
        self._hostname = socket.gethostname()
        #: A drawing's own error, by the drawing's name (see :func:`goes_on`): said once.
        self.draw_errors: dict[str, str] = {}

    # -- layout -------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield RunHeader(id="run-header")
        yield QuietStatic(id="join-line")
        yield FailurePanel(id="failure")
        yield RankTable(id="ranks")
        yield HealthLine(id="health")
        yield PhasePanel(id="phases")
        with Horizontal(id="run-body"):
            with Vertical(id="charts"):
                yield LossChart(id="chart-loss")
                with Horizontal(id="charts-lower"):
                    yield AccuracyChart(id="chart-acc")
                    yield ThroughputChart(id="chart-sps")
            yield SystemPanel(id="system")
        yield RankLogs(self.source.log_path, id="logs")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(FailurePanel).display = False
        self.query_one(HealthLine).display = False
        self.app.feed.start()
        if isinstance(self.source, LiveSource):
            self._drive()
        # Nested widgets (the header's parts) may not be mounted yet: draw after a refresh.
        self.call_after_refresh(self._start_drawing)

    def _start_drawing(self) -> None:
        self._header = self.query_one(RunHeader)
        self._table = self.query_one(RankTable)
        self._health = self.query_one(HealthLine)
        self._phases = self.query_one(PhasePanel)
        self._phases.display = False
        self._failure = self.query_one(FailurePanel)
        self._join = self.query_one("#join-line", QuietStatic)
        self._join.display = False
        self._logs = self.query_one(RankLogs)
        self._charts = (
            self.query_one(LossChart),
            self.query_one(AccuracyChart),
            self.query_one(ThroughputChart),
        )
        self._system = self.query_one(SystemPanel)
        #: What the table and the phase panel share the screen's height with.
        self._fixed = (self._header, self._join, self._failure, self._health, self._logs)
        self._fixed += tuple(self.query(Footer))
        self._view_hz = self.view_hz(len(self.source.state.ranks))
        self._redraw_timers = [
            self.set_interval(1 / self._view_hz, self.refresh_view, name="refresh-view"),
            self.set_interval(1 / (2 * self.chart_hz), self.refresh_charts, name="refresh-charts"),
            self.set_interval(1 / self.panel_hz, self.refresh_slow, name="refresh-slow"),
        ]
        self.refresh_view()
        self.refresh_charts()
        self.refresh_charts()
        self.refresh_slow()

    # -- the live run's worker ------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="drive", exit_on_error=False)
    def _drive(self) -> None:
        assert isinstance(self.source, LiveSource)
        worker = get_current_worker()
        result = self.source.drive(lambda: worker.is_cancelled)
        self.post_message(self.RunEnded(self, result, self.source.error))

    def on_run_screen_run_ended(self, message: RunEnded) -> None:
        if message.screen is not self:
            return
        self.refresh_bindings()
        self.refresh_view()
        self.refresh_charts()
        self.refresh_charts()
        self.refresh_slow()
        after, self._after_end = self._after_end, None
        if after == "restart":
            self.post_message(self.RestartRequested(self.source.config))
        elif after == "back":
            self.post_message(self.BackRequested(self))
        if message.error:
            self.notify(
                printable(message.error),
                title="run could not start",
                severity="error",
                markup=False,
            )

    # -- drawing ------------------------------------------------------------------------------
    @goes_on
    def refresh_view(self) -> None:
        """Header, rank table, health and failure (at :meth:`view_hz`)."""
        if not self._redraw_timers:  # not drawing yet (see _start_drawing)
            return
        source = self.source
        if isinstance(source, LiveSource):
            source.catch_up()  # what came since the last pump, in this frame
        with source.locked():
            frame = run_frame(source.state, source.now())
        self.frame = frame
        if self.view_hz(len(frame.rows)) != self._view_hz:  # the run grew past (or below) it
            self._retime_view(self.view_hz(len(frame.rows)))
        self._header.show(frame, source.config, self.note())
        self._table.show(frame)
        self._health.show(frame.problems)
        self._show_join_line()
        desync = None
        if frame.failure is not None:  # the desync that set it off, when the traces name one
            with source.locked():
                desync = desync_line(source.diagnoses())
        self._failure.show(
            frame.failure,
            frame.rows,
            multi_node=bool(frame.nodes),
            desync=desync,
            tail_lines=SHORT_TAIL_LINES if self.has_class("-short") else TAIL_LINES,
        )
        if self.has_class("-failed") != self._failure.display:  # a short screen drops the charts
            self.set_class(self._failure.display, "-failed")
        # Once laid out: a panel shown just now has no height before its layout.
        self.call_after_refresh(self.fit_heights)
        self.app.feed.set_ranks(self.local_rank_devices(frame))
        self._logs.set_ranks(r.rank for r in frame.rows)
        if self.on_frame_drawn is not None:
            self.call_after_refresh(self.on_frame_drawn, frame)

    def view_hz(self, ranks: int) -> float:
        """How often the header and table refresh for a run of ``ranks`` ranks:
        ``refresh_hz``, at most :data:`LARGE_RUN_HZ` beyond :data:`LARGE_RUN_RANKS` ranks."""
        return min(self.refresh_hz, LARGE_RUN_HZ) if ranks > LARGE_RUN_RANKS else self.refresh_hz

    def _retime_view(self, hz: float) -> None:
        self._view_hz = hz
        self._redraw_timers[0].stop()
        self._redraw_timers[0] = self.set_interval(
            1 / hz, self.refresh_view, name="refresh-view", pause=not self.is_current
        )

    def _show_join_line(self) -> None:
        """A multi-node run started here: the command every other node runs, while nodes
        are still to join (then the lines give the table and charts their room back)."""
        source = self.source
        line = shared = None
        if isinstance(source, LiveSource) and source.running:
            session = source.session
            if getattr(session, "nodes_to_join", None) != 0:
                line = getattr(session, "join_line", None)
                shared = getattr(session, "join_shared_line", None)
        if self._join.display != bool(line):
            self._join.display = bool(line)
        if line:
            # The token is longer than a line: copied off the screen, its wrap breaks it. Where
            # the run directory is shared, the short form does the same.
            text = f"on every other node run:\n{line}"
            if shared:
                text += f"\nor, where this run directory is shared: {shared}"
            self._join.show_text(text)

    def note(self) -> str:
        """What the header says beside the state: replay, starting…, stopping…, an error."""
        source = self.source
        if isinstance(source, LiveSource):
            if source.error:
                return f"could not start: {source.error}"
            if source.running and source.stop_requested:
                return "stopping every worker…"
            if source.running and source.checkpoint_stop:
                return "stopping after the current step with a checkpoint (s again: at once)…"
            if not source.running and source.state.outcome == "stopped":
                checkpoint = source.session.run_dir / CHECKPOINT_FILE
                if source.checkpoint_stop or checkpoint.is_file():
                    return f"to continue: ddptui --resume {source.session.run_dir}"
            if source.running and not source.started.is_set():
                return "launching…"
            return ""
        return source.note

    @goes_on
    def refresh_charts(self) -> None:
        """Charts, each at ``chart_hz``, only when events arrived. The loss and accuracy
        charts and the throughput chart are drawn on alternate ticks, so that no single
        frame pays for every plotext render (which would delay the table's next refresh)."""
        if not self._redraw_timers:
            return
        self._chart_tick += 1
        if self._chart_tick % 2:
            source = self.source
            with source.locked():
                applied = source.state.events_applied
                if applied != self._charted_events:
                    self._charted_events = applied
                    per_rank = self._charts[0].per_rank  # the ranks' own lines, when shown
                    self._chart_data = chart_data(source.state, per_rank=per_rank)
            charts = self._charts[:2]
        else:
            charts = self._charts[2:]
        if self._chart_data is not None:
            for chart in charts:
                chart.show(self._chart_data)

    @goes_on
    def refresh_slow(self) -> None:
        """Phase bars, system panel and logs (at ``panel_hz``). The phase bars are medians
        over each rank's last 30 steps, and the diagnoses they show are made once a second:
        drawn faster, they would only cost more (every rank's medians at each drawing)."""
        if not self._redraw_timers:
            return
        self._show_phases()
        self.call_after_refresh(self.fit_heights)
        feed = self.app.feed
        feed.tick()
        self._system.show(feed, self.node_lines())
        if self._logs.display:
            self._logs.poll()

    def _show_phases(self) -> None:
        source = self.source
        with source.locked():
            self._phases.show(source.state, source.diagnoses())

    def fit_heights(self) -> None:
        """Share the screen's height between the rank table and the phase panel, so that the
        charts keep :data:`CHARTS_MIN_LINES` and the logs and footer stay on screen (8 ranks
        with their phase bars fill a 120x40 screen; 16 overflowed it, and the screen
        scrolled). Each gets what it wants when both fit; else the phase panel about a third
        (fewer bars: the likeliest culprits and every diagnosis stay) and the table the rest,
        which scrolls. A screen too short even for their least still scrolls."""
        height = self.size.height
        if not height or not self._redraw_timers:
            return
        fixed = sum(w.outer_size.height for w in self._fixed if w.display)
        room = height - fixed - self.charts_min_lines()
        table = min(TABLE_MAX_LINES, len(self._table.lines) + 1)
        # What the panel wants, shown or not: bars that did not fit the lines a diagnosis alone
        # had left it drew nothing and hid it, and a hidden panel given no lines stayed hidden
        phases = min(PHASES_MAX_LINES, self._phases.wanted_lines)
        if table + phases > room:
            phases = min(phases, max(PHASES_MIN_LINES, room // 3))
            table = max(TABLE_MIN_LINES, room - phases)
        if self._table.styles.max_height != Scalar.from_number(table):
            self._table.styles.max_height = table
        if phases and self._phases.limit(phases):
            self._show_phases()  # with the bars that fit, not clipped until the next drawing

    def charts_min_lines(self) -> int:
        """The least lines the charts' row keeps (its CSS min-height on this screen's size;
        none on a short screen that shows a failure: the failure comes first)."""
        if not self.has_class("-short"):
            return CHARTS_MIN_LINES
        return 0 if self.has_class("-failed") else SHORT_CHARTS_MIN_LINES

    def local_rank_devices(self, frame: RunFrame) -> dict[int, tuple[int | None, str | None]]:
        """The ranks whose processes run on this machine, for the system feed to track: in a
        multi-node run only this node's (another node's pid means nothing here)."""
        if not frame.nodes:
            return frame.rank_devices
        here = local_node([(n.node, n.host) for n in frame.nodes], self._hostname)
        ranks = (
            {r for n in frame.nodes if n.node == here for r in n.ranks}
            if here is not None
            else set()
        )
        return {r: d for r, d in frame.rank_devices.items() if r in ranks}

    def node_lines(self) -> tuple[NodeSystemLine, ...]:
        """Each node's latest system sample (multi-node runs only): the other nodes' from
        the run state, this machine's from the system feed (live runs only)."""
        frame = self.frame
        if frame is None or not frame.nodes:
            return ()
        with self.source.locked():
            samples = dict(getattr(self.source.state, "node_samples", None) or {})
        nodes = [(n.node, n.host) for n in frame.nodes]
        here = local_node(nodes, self._hostname)
        snapshot = self.app.feed.snapshot
        if isinstance(self.source, LiveSource) and here is not None and snapshot is not None:
            samples[here] = snapshot
        return node_system_lines(nodes, samples, time.time())

    # -- actions ------------------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("stop_run", "collectives"):  # hidden for a replay, greyed out at the end
            if not isinstance(self.source, LiveSource):
                return False
            return True if self.live_running else None
        return True

    @property
    def live_running(self) -> bool:
        return isinstance(self.source, LiveSource) and self.source.running

    def action_stop_run(self) -> None:
        if not self.live_running:
            self.notify("the run is not running", severity="warning")
            return
        assert isinstance(self.source, LiveSource)
        self.source.request_checkpoint_stop()  # a second `s` (or no trainer): at once
        self.refresh_view()

    def _stop_now(self) -> None:
        if self.live_running:
            assert isinstance(self.source, LiveSource)
            self.source.request_stop()
            self.refresh_view()

    def action_collectives(self) -> None:
        """Ask every rank for its Flight Recorder trace now and say what torch's analyzer
        finds: the rank and collective that do not match, or that all match (a worker thread:
        the ranks have a few seconds to answer)."""
        if not self.live_running:
            self.notify("the run is not running", severity="warning")
            return
        assert isinstance(self.source, LiveSource)
        session = self.source.session

        def check() -> None:
            found = session.flight_check(record=False)
            lines = [d.detail for d in found] or [session.flight_note or "no answer"]
            self.app.call_from_thread(
                self.notify,
                printable("\n".join(lines)),  # collective names and shapes: [[8]] is no markup
                title="Collectives",
                markup=False,
                severity="warning" if found else "information",
                timeout=20,
            )

        self.run_worker(check, thread=True, exclusive=True, group="collectives")

    def action_restart(self) -> None:
        if not self.live_running:
            self.post_message(self.RestartRequested(self.source.config))
            return

        def answer(yes: bool | None) -> None:
            if yes:
                self._after_end = "restart"
                self._stop_now()

        self.app.push_screen(
            ConfirmScreen(
                "The run is still going. Stop every worker and start it again "
                "with the same options?",
                yes="Restart",
            ),
            answer,
        )

    def action_back(self) -> None:
        if not self.live_running:
            self.post_message(self.BackRequested(self))
            return

        def answer(yes: bool | None) -> None:
            if yes:
                self._after_end = "back"
                self._stop_now()

        self.app.push_screen(
            ConfirmScreen(
                "The run is still going. Stop every worker and go back to the form?", yes="Stop run"
            ),
            answer,
        )

    def action_toggle_logs(self) -> None:
        logs = self.query_one(RankLogs)
        logs.display = not logs.display
        if logs.display:
            logs.poll()

    def action_cycle_log_filter(self) -> None:
        logs = self.query_one(RankLogs)
        if not logs.display:
            logs.display = True
        logs.cycle_filter()

    def action_toggle_loss(self) -> None:
        chart = self.query_one(LossChart)
        chart.set_per_rank(not chart.per_rank)
        if self._chart_data is not None:
            if chart.per_rank and not self._chart_data.loss_by_rank:  # not made for the mean
                with self.source.locked():
                    self._chart_data = chart_data(self.source.state)
            chart.show(self._chart_data)

    def action_monitor(self) -> None:
        self.app.open_monitor()

    def on_screen_suspend(self) -> None:
        # Hidden (another mode, or the monitor): stop drawing; the run itself goes on.
        for timer in self._redraw_timers:
            timer.pause()

    def on_screen_resume(self) -> None:
        if not self._redraw_timers:  # the first showing: on_mount starts everything
            return
        for timer in self._redraw_timers:
            timer.resume()
        self.refresh_view()
