"""The dashboard app, its one factory (used by the CLI, the tests and the benchmark), and
``run_dashboard`` (the CLI's entry point).

Everything slow or external is injected through :class:`Deps`: machine detection, the monitor
sampler, the RunSession factory, where recent runs live, refresh rates and, for replays, a
frozen clock. The CLI uses the defaults; tests pass fakes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from textual import work
from textual.app import App
from textual.binding import Binding
from textual.screen import Screen

from ddptui.formatting import printable
from ddptui.monitor.pcie import pcie_interval
from ddptui.run.options import RunConfig, new_run_id
from ddptui.run.rundir import EXIT_CODES
from ddptui.run.session import RunSession
from ddptui.run.signals import quiet_lost_terminal, teardown_signals
from ddptui.tui.machine import HostInfo, detect_host
from ddptui.tui.screens.confirm import ConfirmScreen
from ddptui.tui.screens.launch import LaunchScreen
from ddptui.tui.screens.monitor import MonitorScreen
from ddptui.tui.screens.run import RunScreen
from ddptui.tui.sources import LiveSource, ReplaySource, RunSource
from ddptui.tui.system_feed import SamplerLike, SystemFeed, default_sampler

#: Longest wait for a run's workers to be stopped when quitting.
STOP_TIMEOUT_S = 20.0


@dataclass
class Deps:
    """What the dashboard needs from the outside world (fakes in tests)."""

    detect_host: Callable[[], HostInfo] = detect_host
    make_sampler: Callable[[float], SamplerLike] = default_sampler
    #: Clock of live runs (elapsed, ETA, last seen, health); used by the default factory.
    clock: Callable[[], float] = time.monotonic
    #: Builds the RunSession of a launched run (default: ``RunSession(cfg, clock=clock)``).
    session_factory: Callable[[RunConfig], RunSession] | None = None
    runs_root: Path = Path("runs")
    #: Header and rank table redraws per second. Not 4: an event arriving just after a redraw
    #: would wait 250 ms plus the redraw; 4.5 Hz measured (benchmarks/bench_tui.py) keeps the
    #: worst delay under 250 ms at under 10 % of a core.
    refresh_hz: float = 4.5
    #: Chart redraws per second (plotext is the costliest thing on screen).
    chart_hz: float = 0.5
    #: System panel and log redraws per second.
    panel_hz: float = 1.0
    #: Seconds between monitor samples.
    monitor_interval: float = 1.0
    #: Replays show the run as of this time (default: its last event).
    replay_now: float | None = None
    #: SIGTERM and SIGHUP stop the runs and end the app (the CLI's dashboard; not in tests).
    catch_signals: bool = False
    #: How the app ends after SIGHUP, once its runs have stopped (see ``DdpTuiApp._leave``).
    hard_exit: Callable[[int], Any] = os._exit


class DdpTuiApp(App[int]):
    """ddptui's dashboard: launch form, run screen, replay and monitor."""

    CSS_PATH = Path(__file__).with_name("app.tcss")  # absolute: subclasses live elsewhere
    TITLE = "ddptui"
    BINDINGS = [Binding("ctrl+q", "quit", "Quit", show=False)]

    def __init__(
        self,
        mode: str = "run",
        *,
        deps: Deps | None = None,
        cfg: RunConfig | None = None,
        raw: dict[str, Any] | None = None,
        start: bool = False,
        run_dir: Path | None = None,
        replay_source: RunSource | None = None,
        host_info: HostInfo | None = None,
    ):
        super().__init__()
        if mode not in ("run", "monitor", "replay"):
            raise ValueError(f"unknown dashboard mode {mode!r}")
        self.mode = mode
        self.deps = deps or Deps()
        self.cfg = cfg
        self.raw = dict(raw or {})
        self.start_at_once = start
        self.replay_dir = run_dir
        self.replay_source = replay_source
        self.host_info: HostInfo | None = host_info
        self.feed = SystemFeed(self.deps.make_sampler, self.deps.monitor_interval)
        self.live_sources: list[LiveSource] = []
        self._quitting = False
        self._signal_code: int | None = None
        self._hung_up = False
        self._caught: list[tuple[int, Any]] = []  # (signal, its handler before)
        self._run_screens = 0
        self._monitor_return: str | None = None

    # -- start-up and navigation --------------------------------------------------------------
    # Each screen is the base of its own Textual mode ("form", "run-N", "monitor") instead of
    # being stacked: a screen left below the visible one is a "background screen" in Textual,
    # and it turned every partial repaint of the run screen into a full-screen one.
    def on_mount(self) -> None:
        if self.deps.catch_signals:
            self._catch_signals()
        if self.mode == "monitor":
            self._enter("monitor", MonitorScreen(refresh_hz=1 / self.deps.monitor_interval))
            return
        # The form is built only when it is shown (a replay or --start may never need it).
        if self.mode == "replay":
            if self.replay_source is not None:
                self.show_run(self.replay_source)
            elif self.replay_dir is not None:
                self._load_replay(self.replay_dir)
        elif self.start_at_once and self.cfg is not None:
            self.launch(self.cfg)
        else:
            self.show_form()

    def _enter(self, mode: str, screen: Screen) -> None:
        """Show ``screen`` as the base of ``mode`` (replacing that mode's old screens)."""
        if mode in self._modes:
            if self.current_mode == mode:
                self.switch_mode("_default")
            self.remove_mode(mode)
        self.add_mode(mode, lambda: screen)
        self.switch_mode(mode)

    def _drop_mode(self, mode: str | None) -> None:
        if mode and mode in self._modes and mode != self.current_mode:
            self.remove_mode(mode)

    def show_form(self) -> None:
        """The launch form, as it was left (created on first use)."""
        if "form" not in self._modes:
            self.add_mode("form", lambda: LaunchScreen(self.raw, self.deps.runs_root))
            self.switch_mode("form")
            return
        self.switch_mode("form")
        self.screen.action_reload_runs()

    def on_unmount(self) -> None:
        self.feed.stop()
        loop = asyncio.get_running_loop()
        for sig, previous in self._caught:
            loop.remove_signal_handler(sig)
            signal.signal(sig, previous)  # asyncio leaves the default, not what was there

    # -- signals ------------------------------------------------------------------------------
    def _catch_signals(self) -> None:
        """SIGTERM, and SIGHUP (the terminal gone: an ssh session dropped, a tmux server
        killed), stop the runs and end the app, as a quit does: each run's ``summary.json``
        is written and its trace sockets' folder removed, where their default ended ddptui at
        once with neither. Taken by the event loop, so the handler runs as a callback of it,
        never between two of the app's own lines; SIGHUP not where it is ignored (nohup)."""
        loop = asyncio.get_running_loop()
        for sig in teardown_signals():
            if sig == signal.SIGINT:  # a key in the dashboard (Textual's raw mode), not a signal
                continue
            previous = signal.getsignal(sig)
            try:
                loop.add_signal_handler(sig, self._signalled, sig)
            except (ValueError, RuntimeError, NotImplementedError):  # not the main thread
                continue
            self._caught.append((sig, previous))

    def _signalled(self, signum: int) -> None:
        """A teardown signal: every running run stops as ``interrupted``; the app exits with
        128 + the signal once they have (ddptui --no-ui's exit code)."""
        hung_up = signum == getattr(signal, "SIGHUP", None) and not self._hung_up
        if hung_up:
            quiet_lost_terminal()
            self._hung_up = True
        if self._signal_code is None:
            self._signal_code = 128 + signum
            for source in self.running_sources:
                source.interrupt(self._signal_code)
        elif not hung_up:
            return  # the runs are stopping already
        if self._hung_up:
            # Not on the event loop: a render may block it for good once the terminal is
            # gone (Textual's output thread died writing to it, and its queue of writes
            # filled: seen with a tmux server killed while a run stopped, the process left
            # spinning at 68 % of a core, its run stopped).
            threading.Thread(
                target=self._leave_once_stopped,
                args=(self._signal_code,),
                name="ddptui-hangup",
                daemon=True,
            ).start()
            return
        if not self.running_sources:
            self._leave(self._signal_code)
            return
        self._quitting = True
        self.set_interval(0.1, self._exit_when_stopped, name="signal-wait")

    def _leave_once_stopped(self, code: int) -> None:
        """After SIGHUP, from a thread of its own: once every run has stopped (its workers
        ended after :data:`STOP_TIMEOUT_S` if it has not), the process ends."""
        for source in list(self.live_sources):
            if not source.abandon() and not source.done.wait(STOP_TIMEOUT_S):
                source.kill_workers()
        self._leave(code)

    def _leave(self, code: int) -> None:
        """End the app with ``code``. After SIGHUP, once the runs have stopped (their files
        written and closed), the process ends at once: Textual's output thread died writing
        to the hung-up terminal, and its shutdown, which writes to restore the terminal,
        waited on that thread forever (seen: the runs' summaries written, ddptui still there
        minutes later)."""
        if not self._hung_up:
            self.exit(code)
            return
        self.feed.stop()
        self.deps.hard_exit(code)

    # -- runs ---------------------------------------------------------------------------------
    def show_run(self, source: RunSource) -> None:
        """Show a run; the previous run's screen (its run has ended) is dropped."""
        previous = self.current_mode if self.current_mode.startswith("run-") else None
        self._run_screens += 1
        self._enter(
            f"run-{self._run_screens}",
            RunScreen(source, self.deps.refresh_hz, self.deps.chart_hz, self.deps.panel_hz),
        )
        self._drop_mode(previous)

    def launch(self, cfg: RunConfig) -> LiveSource:
        factory = self.deps.session_factory or (lambda c: RunSession(c, clock=self.deps.clock))
        source = LiveSource(cfg, factory)
        self.live_sources.append(source)
        self.show_run(source)
        return source

    def open_monitor(self) -> None:
        """The GPU/system monitor over the current run (Esc comes back)."""
        self._monitor_return = self.current_mode
        self._enter("monitor", MonitorScreen(refresh_hz=self.deps.panel_hz, standalone=False))

    def close_monitor(self) -> None:
        back = self._monitor_return
        if back and back in self._modes:
            self.switch_mode(back)
            self._drop_mode("monitor")

    @work(thread=True, exclusive=True, group="replay")
    def _load_replay(self, run_dir: Path) -> None:
        try:
            source = ReplaySource.load(run_dir, now=self.deps.replay_now)
        except (OSError, ValueError) as exc:
            self.call_from_thread(self.notify, f"cannot open {run_dir}: {exc}", severity="error")
            return
        self.call_from_thread(self.show_run, source)

    def on_launch_screen_launch_requested(self, message: LaunchScreen.LaunchRequested) -> None:
        self.raw = message.raw
        self.launch(message.config)

    def on_launch_screen_replay_requested(self, message: LaunchScreen.ReplayRequested) -> None:
        self._load_replay(message.run_dir)

    def on_run_screen_restart_requested(self, message: RunScreen.RestartRequested) -> None:
        try:
            cfg = restart_config(message.config)
        except (TypeError, ValueError) as exc:
            self.notify(
                printable(f"cannot restart this run: {exc}"), severity="error", markup=False
            )
            return
        self.launch(cfg)

    def on_run_screen_back_requested(self, message: RunScreen.BackRequested) -> None:
        if self.screen is not message.screen:
            return
        previous = self.current_mode
        self.show_form()
        self._drop_mode(previous)

    def on_run_screen_run_ended(self, message: RunScreen.RunEnded) -> None:
        if self._quitting:
            self._exit_when_stopped()

    # -- quitting -----------------------------------------------------------------------------
    @property
    def running_sources(self) -> list[LiveSource]:
        return [s for s in self.live_sources if s.running]

    def exit_code(self) -> int:
        """The exit code headless would give: 1 when a launched run failed, else that of the
        last run (0 finished, 3 hung, 130 stopped, as its summary.json says), 0 without one."""
        if self._signal_code is not None:
            return self._signal_code
        failed = any(s.state.outcome == "failed" or s.error for s in self.live_sources)
        if failed:
            return 1
        if not self.live_sources:
            return 0
        return EXIT_CODES.get(self.live_sources[-1].state.outcome or "", 0)

    async def action_quit(self) -> None:
        running = self.running_sources
        if not running:
            self.exit(self.exit_code())
            return
        if self._quitting:
            return

        def answer(yes: bool | None) -> None:
            if yes:
                self._quitting = True
                for source in running:
                    source.request_stop()
                self.notify("stopping every worker…", title="quitting")
                self.set_interval(0.1, self._exit_when_stopped, name="quit-wait")

        n = sum(s.cfg.world_size for s in running)
        self.push_screen(
            ConfirmScreen(
                f"A run is live ({n} ranks). Quitting stops every worker.\n\nStop the run and "
                "quit?",
                yes="Stop and quit",
            ),
            answer,
        )

    def _exit_when_stopped(self) -> None:
        if not self.running_sources:
            self._leave(self.exit_code())

    def stop_everything(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """After the app has exited: make sure no run is left running (blocking).

        Each run's driving thread stops its workers and closes its session's socket itself
        (the socket is that thread's); this only asks, and waits. A run no thread drives
        yet is abandoned (it never starts). If a driving thread does not finish within
        ``timeout``, the worker processes are ended from here, and the socket is left to
        its thread.
        """
        for source in self.live_sources:
            source.request_stop()
        for source in self.live_sources:
            if source.abandon():
                continue
            if not source.done.wait(timeout):
                source.kill_workers()
        self.feed.stop()


def restart_config(config: dict[str, Any]) -> RunConfig:
    """The same run options with a new run id and a fresh run directory."""
    names = {f.name for f in dataclasses.fields(RunConfig)}
    values = {k: v for k, v in config.items() if k in names}
    values["script_args"] = tuple(values.get("script_args") or ())
    old_id = str(values.get("run_id") or "")
    new_id = new_run_id()
    run_dir = values.get("run_dir")
    if run_dir:
        path = Path(run_dir)
        if path.name == old_id:
            path = path.with_name(new_id)
        else:  # a directory the user named: keep the name, number the restarts
            base = path.name.split("-restart")[0]
            n = 2
            while path.with_name(f"{base}-restart{n}").exists():
                n += 1
            path = path.with_name(f"{base}-restart{n}")
        values["run_dir"] = str(path)
    values["run_id"] = new_id
    return RunConfig(**values)


def create_app(mode: str = "run", *, deps: Deps | None = None, **kwargs: Any) -> DdpTuiApp:
    """The one app factory: the CLI, snapshot tests, pilot tests and the benchmark use it."""
    return DdpTuiApp(mode, deps=deps, **kwargs)


def run_dashboard(mode: str, **kwargs: Any) -> int:
    """Run the dashboard until quit; stop every worker on the way out. Returns the exit
    code: 0, or 1 if a launched run failed. ``interval``: seconds between monitor samples;
    ``pcie``: also read PCIe throughput (True: every 5 s, or seconds; ValueError if bad)."""
    interval = kwargs.pop("interval", None)
    pcie = kwargs.pop("pcie", False)
    pcie_interval(pcie)  # a bad value is refused here, not inside the running app
    deps = Deps(catch_signals=True)
    if interval is not None:
        deps.monitor_interval = float(interval)
    if pcie:  # PCIe throughput on its own thread, shown on each GPU card with its age
        deps.make_sampler = functools.partial(default_sampler, pcie=pcie)
    app = create_app(mode, deps=deps, **kwargs)
    try:
        code = app.run()
    finally:
        app.stop_everything()
    return code if isinstance(code, int) else app.exit_code()
