"""Dashboard behaviour with Pilot: the form validates like the CLI, runs are driven and
stopped from the keyboard, quitting a live run asks first and stops every worker. Fakes only
(no processes): see test_tui_real_run.py for a real 2-rank run."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from textual.widgets import Button, DataTable, Input, Log, Select

from ddptui.run.config import build_config, check_options
from ddptui.run.machine import Machine
from ddptui.tui import app as app_module
from ddptui.tui.machine import HostInfo
from ddptui.tui.model import RANK_COLUMNS
from ddptui.tui.screens.confirm import ConfirmScreen
from ddptui.tui.screens.launch import OWN_SCRIPT, LaunchScreen
from ddptui.tui.screens.run import RunScreen
from ddptui.tui.sources import LiveSource, ReplaySource
from ddptui.tui.widgets.failure import FailurePanel
from ddptui.tui.widgets.ranks import HealthLine, RankTable
from tests.helpers import pilot_until
from tests.tui_fixtures.fakes import (
    FAILED_RUN,
    MID_RUN,
    NO_CUDA_HOST,
    RUNS,
    FakeSession,
    fake_deps,
    primed_app,
    replay,
)

pytestmark = pytest.mark.waits  # mostly waits on timers: run beside real runs (tests/conftest.py)

SIZE = (120, 40)


def _app(tmp_path, **kwargs):
    sessions: list[FakeSession] = []

    def session_factory(cfg):
        sessions.append(FakeSession(cfg, hold=kwargs.pop("hold", True)))
        return sessions[-1]

    deps = fake_deps(
        runs_root=kwargs.pop("runs_root", RUNS),
        session_factory=session_factory,
        refresh_hz=4.0,
        chart_hz=2.0,
    )
    app = primed_app(
        "run", deps=deps, raw=kwargs.pop("raw", {"run_dir": str(tmp_path / "r")}), **kwargs
    )
    app.sessions = sessions
    return app


async def _wait(pilot, predicate, timeout: float = 5.0) -> None:
    await pilot_until(pilot, predicate, timeout)


def _starting(app, tmp_path):
    """``app``, made to launch a run at once (as ``ddptui --start`` does)."""
    app.start_at_once = True
    app.cfg = build_config({"run_dir": str(tmp_path / "r"), "backend": "gloo"})
    return app


async def _started(pilot, app) -> LiveSource:
    """The run the app launched at once, once its session has started."""
    await _wait(pilot, lambda: isinstance(app.screen, RunScreen))
    source = app.screen.source
    await _wait(pilot, lambda: source.started.is_set())
    return source


# -- the form -------------------------------------------------------------------------------
async def test_form_shows_the_clis_own_messages(tmp_path):
    app = _app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        screen = app.screen
        assert isinstance(screen, LaunchScreen)
        screen.query_one("#f-world_size", Input).value = "0"
        screen.query_one("#f-backend", Select).value = "nccl"
        await pilot.pause()
        expected = check_options(screen.raw_options(), NO_CUDA_HOST.machine)
        assert {e.field for e in expected} == {"world_size", "backend"}
        for error in expected:
            assert str(error) in str(screen.query_one(f"#err-{error.field}").render())
        assert screen.query_one("#launch", Button).disabled
        screen.query_one("#f-world_size", Input).value = "2"
        screen.query_one("#f-backend", Select).value = "gloo"
        await pilot.pause()
        assert screen.validate() == []
        assert not screen.query_one("#launch", Button).disabled


@pytest.mark.parametrize(("width", "narrow"), [(80, True), (120, False)])
async def test_the_form_and_the_side_panel_share_a_narrow_terminal(tmp_path, width, narrow):
    """At 80 columns the side panel (machine, recent runs) showed its first 20 columns."""
    app = _app(tmp_path)
    async with app.run_test(size=(width, 24)) as pilot:
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, LaunchScreen) and screen.has_class("-narrow") == narrow
        side, form = screen.query_one("#side").region, screen.query_one("#form").region
        assert side.right <= width and side.width >= 24 and form.width >= 44
        assert form.right <= side.x
        # Its titles wrap rather than stop short ("Recent runs (Enter opens a" at 80 columns).
        title = screen.query(".panel-title").last()
        assert str(title.render()) == "Recent runs (Enter opens a replay)"
        assert title.size.height == (2 if narrow else 1) and title.size.width <= side.width


async def test_nccl_world_size_above_gpu_count_is_explained(tmp_path):
    gpus = HostInfo(Machine(2, "", 8), None)
    app = _app(tmp_path, host_info=gpus, raw={"backend": "nccl", "world_size": "4"})
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        text = str(app.screen.query_one("#err-world_size").render())
        assert "more than the 2 GPU(s)" in text


async def test_command_line_options_prefill_the_form(tmp_path):
    raw = {
        "script": "tests/scripts/user_ddp.py",
        "script_args": ("--steps", "3"),
        "launcher": "spawn",
        "world_size": "3",
        "epochs": "2",
        "run_dir": str(tmp_path / "x"),
        "hang_timeout": "30",
    }
    app = _app(tmp_path, raw=raw)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        screen = app.screen
        assert screen.query_one("#f-trainer", Select).value == OWN_SCRIPT
        assert screen.query_one("#row-script").display
        assert screen.query_one("#f-script_args", Input).value == "--steps 3"
        options = screen.raw_options()
        assert options["world_size"] == "3" and options["epochs"] == "2"
        assert options["hang_timeout"] == "30"  # not on the form, kept from the command line
        cfg = build_config(options, NO_CUDA_HOST.machine)
        assert (
            cfg.launcher == "spawn" and cfg.world_size == 3 and cfg.script_args == ("--steps", "3")
        )


async def test_recent_run_opens_in_replay(tmp_path):
    app = _app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await app.workers.wait_for_complete()
        await pilot.pause()
        table = app.screen.query_one("#recent", DataTable)
        keys = [row.value for row in table.rows]
        assert str(FAILED_RUN) in keys
        table.focus()
        table.move_cursor(row=keys.index(str(FAILED_RUN)))
        await pilot.press("enter")
        await _wait(pilot, lambda: isinstance(app.screen, RunScreen))
        assert isinstance(app.screen.source, ReplaySource)
        assert app.screen.source.state.status == "failed"


# -- a run driven from the dashboard (fake session) ---------------------------------------------
async def test_launch_stop_back_and_quit(tmp_path):
    app = _app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("f5")
        await _wait(pilot, lambda: isinstance(app.screen, RunScreen))
        screen = app.screen
        source = screen.source
        assert isinstance(source, LiveSource)
        table = screen.query_one(RankTable)
        await _wait(pilot, lambda: len(table.shown) == 2)
        await pilot.press("s")
        await _wait(pilot, lambda: source.done.is_set())
        assert app.sessions[0].calls == ["start", "stop", "close"]
        await _wait(pilot, lambda: screen.frame.status == "stopped")
        await pilot.press("b")
        await _wait(pilot, lambda: isinstance(app.screen, LaunchScreen))
        await pilot.press("ctrl+q")  # nothing live: quits without asking
        await pilot.pause()
    assert app.return_code == 0


async def test_quit_while_live_asks_then_stops_every_worker(tmp_path):
    app = _app(tmp_path, raw={"run_dir": str(tmp_path / "r")})
    _starting(app, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        source = await _started(pilot, app)
        await pilot.press("q")
        await _wait(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("n")  # changed my mind: the run goes on
        await _wait(pilot, lambda: isinstance(app.screen, RunScreen))
        assert source.running
        await pilot.press("q")
        await _wait(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("y")
        await _wait(pilot, lambda: not app.is_running or source.done.is_set())
        await pilot.pause(0.3)
    assert source.done.is_set()
    assert app.sessions[0].calls == ["start", "stop", "close"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
async def test_a_signal_stops_the_live_run_as_interrupted_and_exits_with_its_code(
    tmp_path, monkeypatch, sig
):
    """SIGTERM, or SIGHUP (the terminal gone), to the dashboard: its live run stops as
    ``interrupted`` with 128 + the signal, as ``ddptui --no-ui``'s; their default ended
    ddptui at once, with no summary.json and the trace sockets' folder left. After SIGHUP the
    process ends at once once the run has stopped (Textual's shutdown would write to the
    terminal that is gone); the handlers ddptui found are put back."""
    exits, quieted = [], []
    monkeypatch.setattr(app_module, "quiet_lost_terminal", lambda: quieted.append(True))
    inherited = signal.getsignal(sig)
    # As a user at a terminal has it: a suite run under nohup inherits SIGHUP ignored, which
    # the dashboard respects (it leaves an ignored SIGHUP alone by design).
    signal.signal(sig, signal.SIG_DFL)
    try:
        await _signal_stops_the_live_run(tmp_path, sig, exits, quieted)
    finally:
        signal.signal(sig, inherited)


async def _signal_stops_the_live_run(tmp_path, sig, exits, quieted) -> None:
    before = signal.getsignal(sig)
    app = _app(tmp_path)
    app.deps.catch_signals = True
    app.deps.hard_exit = exits.append
    _starting(app, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        source = await _started(pilot, app)
        os.kill(os.getpid(), sig)
        await _wait(pilot, lambda: source.done.is_set())
        if sig == signal.SIGHUP:
            await _wait(pilot, lambda: exits)  # (the fake exit returns: the timer goes on)
            assert set(exits) == {129}
            assert quieted == [True] and app.is_running  # ended by the process's exit
        else:
            await _wait(pilot, lambda: not app.is_running)
    assert app.sessions[0].stops == [(True, 128 + sig)]
    assert app.sessions[0].calls == ["start", "stop", "close"]
    if sig == signal.SIGTERM:
        assert app.return_value == 143 and exits == [] and quieted == []
    assert signal.getsignal(sig) == before


async def test_after_a_hangup_the_process_ends_though_the_event_loop_is_blocked(
    tmp_path, monkeypatch
):
    """The terminal gone while a run stops: Textual's output thread died writing to it, its
    queue of writes filled, and a render blocked the event loop for good, where the wait for
    the run to stop ran: the process stayed, spinning, its run stopped. The wait is a thread
    of its own now."""
    exits, quieted = [], []
    monkeypatch.setattr(app_module, "quiet_lost_terminal", lambda: quieted.append(True))
    app = _app(tmp_path)
    app.deps.hard_exit = exits.append
    _starting(app, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        source = await _started(pilot, app)
        app._signalled(signal.SIGHUP)
        deadline = time.monotonic() + 20
        while not exits and time.monotonic() < deadline:
            time.sleep(0.05)  # the event loop blocked, as behind a full queue of writes
        assert exits == [129] and source.done.is_set() and quieted == [True]
    assert app.sessions[0].stops == [(True, 129)]


class _FakeLauncher:
    def __init__(self) -> None:
        self.stopped_on: list[str] = []

    def stop(self) -> None:
        self.stopped_on.append(threading.current_thread().name)


class _SlowStopSession(FakeSession):
    """A session whose teardown hangs (a rank that ignores SIGTERM, a stuck file system)
    until the test releases it."""

    def __init__(self, cfg) -> None:
        super().__init__(cfg)
        self.release = threading.Event()
        self.stopping = threading.Event()
        self.launcher = _FakeLauncher()

    def stop(self):
        self.stopping.set()
        self.release.wait(10)
        return super().stop()


def _session_threads(session: FakeSession) -> set[str]:
    return {thread for _, thread in session.threads}


async def test_every_session_call_is_on_its_driving_thread(tmp_path):
    app = _app(tmp_path)
    _starting(app, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        source = await _started(pilot, app)
        await pilot.press("s")
        await _wait(pilot, lambda: source.done.is_set())
    app.stop_everything(timeout=5)
    session = app.sessions[0]
    assert session.calls == ["start", "stop", "close"]
    assert _session_threads(session) == {source.driver.name}
    assert source.driver is not threading.main_thread()


async def test_quitting_never_closes_the_socket_from_another_thread(tmp_path):
    """issue 7 defect 9: the socket is closed by the thread that owns it, after it stopped."""
    sessions: list[_SlowStopSession] = []

    def factory(cfg):
        sessions.append(_SlowStopSession(cfg))
        return sessions[-1]

    app = primed_app("run", deps=fake_deps(session_factory=factory, refresh_hz=4.0))
    _starting(app, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        source = await _started(pilot, app)
    # The app has gone; its worker is told to stop and hangs in the session's stop().
    session = sessions[0]
    assert session.stopping.wait(10)
    app.stop_everything(timeout=0.2)  # gives up waiting: last resort from this thread
    assert ("close", threading.current_thread().name) not in session.threads
    assert "close" not in session.calls  # the socket is left to its own thread...
    assert session.launcher.stopped_on == [threading.current_thread().name]  # workers ended
    session.release.set()
    assert source.done.wait(10)
    assert session.calls == ["start", "stop", "close"]
    assert _session_threads(session) == {source.driver.name}
    assert source.driver is not threading.current_thread()


def test_a_source_abandoned_before_it_is_driven_never_starts(tmp_path):
    cfg = build_config({"run_dir": str(tmp_path / "r"), "backend": "gloo"})
    source = LiveSource(cfg, FakeSession)
    assert source.abandon() and source.done.is_set() and not source.running
    assert source.drive() is None
    assert source.session.calls == []
    driven = LiveSource(cfg, lambda c: FakeSession(c, hold=False))
    driven.drive()
    assert not driven.abandon()  # already driven: nothing to abandon
    assert driven.session.calls == ["start", "close"]


async def test_restart_launches_the_same_options_again(tmp_path):
    app = _app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("f5")
        await _wait(pilot, lambda: isinstance(app.screen, RunScreen))
        first = app.screen.source
        await _wait(pilot, lambda: first.started.is_set())
        await pilot.press("r")
        await _wait(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("y")
        await _wait(
            pilot, lambda: isinstance(app.screen, RunScreen) and app.screen.source is not first
        )
        second = app.screen.source
        assert first.done.is_set() and "stop" in app.sessions[0].calls
        assert second.cfg.run_id != first.cfg.run_id
        assert second.cfg.script_args == first.cfg.script_args
        assert second.cfg.world_size == first.cfg.world_size
        assert second.cfg.run_dir != first.cfg.run_dir
        second.request_stop()
        await _wait(pilot, lambda: second.done.is_set())


# -- what the run screen shows --------------------------------------------------------------------
async def test_failure_names_the_rank_how_and_its_stderr(tmp_path):
    app = primed_app("replay", replay_source=replay(FAILED_RUN))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        panel = app.screen.query_one(FailurePanel)
        assert panel.display
        text = str(panel.content)
        assert "rank 1 exited with code 1" in text
        assert "RuntimeError: boom on rank 1" in text
        assert "other ranks: rank 0 failed" in text
        states = [row.state for row in app.screen.frame.rows]
        assert states == ["failed", "failed"]


async def test_straggler_is_highlighted_with_the_reason():
    source = replay(MID_RUN, now_offset=0.5)
    source.note = ""
    slow = source.state.ranks[1]
    for _ in range(10):
        slow.recent_step_times.append(0.2)  # 8x the other rank's step time
    app = primed_app("replay", replay_source=source)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        health = app.screen.query_one(HealthLine)
        assert health.display
        assert "rank 1 straggler: step time 200 ms" in str(health.content)
        shown = app.screen.query_one(RankTable).shown[1]
        assert shown[RANK_COLUMNS.index("state")] == "⚠ straggler"


async def test_logs_filter_by_rank_and_toggle():
    app = primed_app("replay", replay_source=replay(FAILED_RUN))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.2)
        log = app.screen.query_one(Log)
        assert any(line.startswith("r0│") for line in log.lines)
        assert any(line.startswith("r1│") for line in log.lines)
        await pilot.press("f")  # all -> rank 0
        await pilot.pause()
        assert log.lines and all(line.startswith("r0│") for line in log.lines)
        await pilot.press("f")  # rank 0 -> rank 1
        await pilot.pause()
        assert log.lines and all(line.startswith("r1│") for line in log.lines)
        await pilot.press("l")
        await pilot.pause()
        assert not app.screen.query_one("#logs").display


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
async def test_the_logs_pane_gives_its_lines_to_the_log_not_to_an_empty_scrollbar(size):
    """Textual's ``Log`` always shows its horizontal scrollbar: at 80x24 the empty bar took
    one of the pane's three lines. It shows only when a line is wider than the pane."""
    app = primed_app("replay", replay_source=replay(FAILED_RUN))
    async with app.run_test(size=size) as pilot:
        await pilot.pause(0.2)
        log = app.screen.query_one(Log)
        rows = log.size.height
        log.clear()
        log.write_lines([f"r0│ line {i}" for i in range(rows)])  # fits exactly
        await pilot.pause()
        assert not log.show_horizontal_scrollbar
        assert log.scrollable_content_region.height == rows
        assert log.lines[-1] in log.render_line(rows - 1).text  # the newest line in view
        log.write_line("r0│ " + "x" * 300)  # wider than the pane
        await pilot.pause()
        assert log.show_horizontal_scrollbar
        assert log.scrollable_content_region.height == rows - 1


def _newest_in_view(log) -> bool:
    shown = [log.render_line(y).text for y in range(log.scrollable_content_region.height)]
    return any(log.lines[-1][:30] in line for line in shown)


async def test_the_logs_pane_keeps_its_newest_line_in_view_until_its_user_scrolls_up():
    """open_clip's run showed its first four lines for two minutes: Textual's Log follows only
    when at its end as counted before a write, and a line wider than the pane (its scrollbar
    took a row) or the pane shrinking left it a row or more short of the end for good."""
    app = primed_app("replay", replay_source=replay(FAILED_RUN))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.2)
        log = app.screen.query_one(Log)
        log.clear()
        log.write_lines([f"r0│ a {i}" for i in range(3)])
        await pilot.pause()
        log.write_lines([f"r0│ b {i} " + ("x" * 300 if i == 5 else "") for i in range(20)])
        await pilot.pause()
        assert log.show_horizontal_scrollbar and _newest_in_view(log)
        app.screen.query_one("#logs").styles.height = 5  # the pane shrinks
        await pilot.pause()
        log.write_lines([f"r0│ c {i}" for i in range(4)])
        await pilot.pause()
        assert _newest_in_view(log)
        log.focus()
        await pilot.press("home")  # its user scrolls up: new lines do not move the view
        await pilot.pause()
        log.write_lines([f"r0│ d {i}" for i in range(4)])
        await pilot.pause()
        assert log.scroll_y == 0 and not _newest_in_view(log)
        await pilot.press("end")  # back at the end: it follows again
        await pilot.pause()
        log.write_lines([f"r0│ e {i}" for i in range(4)])
        await pilot.pause()
        assert _newest_in_view(log)


async def test_monitor_opens_from_a_run_and_labels_ranks():
    source = replay(MID_RUN)
    app = primed_app("replay", replay_source=source)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("g")
        await pilot.pause()
        table = app.screen.query_one("#monitor-procs", DataTable)
        labels = {
            str(table.get_row_at(i)[1]): str(table.get_row_at(i)[2]) for i in range(table.row_count)
        }
        assert labels["1001"] == "rank 0" and labels["1002"] == "rank 1"
        assert labels["4242"] == "other"
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, RunScreen)


@pytest.mark.parametrize("mode", ["monitor"])
async def test_monitor_mode_quits_with_q(mode):
    app = primed_app(mode)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("q")
        await pilot.pause()
    assert app.return_code == 0
    assert app.feed.sampler.stopped


async def test_standalone_monitor_labels_rank_processes_of_any_run(monkeypatch):
    import ddptui.tui.system_feed as system_feed

    asked = []

    def labels(pids):  # stands in for reading each GPU process's environment
        asked.append(tuple(pids))
        return {1001: "rank 0 · run other-run"}

    monkeypatch.setattr(system_feed, "rank_labels_from_environment", labels)
    app = primed_app("monitor")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(1.2)
        table = app.screen.query_one("#monitor-procs", DataTable)
        rows = {
            str(table.get_row_at(i)[1]): str(table.get_row_at(i)[2]) for i in range(table.row_count)
        }
    assert rows["1001"] == "rank 0 · run other-run"
    assert rows["1002"] == "other" and rows["4242"] == "other"
    assert asked and set(asked[-1]) == {1001, 1002, 4242}


async def test_a_multi_node_run_shows_the_join_line_while_it_runs(tmp_path):
    app = _app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("f5")
        await _wait(pilot, lambda: isinstance(app.screen, RunScreen))
        screen = app.screen
        join = screen.query_one("#join-line")
        assert not join.display  # a single-node run has no join line
        app.sessions[0].join_line = "ddptui join ddp1.token"
        await _wait(pilot, lambda: join.display)
        assert "ddptui join ddp1.token" in str(join.content)
        assert "shared" not in str(join.content)  # no token file written: no short form
        app.sessions[0].join_shared_line = "ddptui join /shared/runs/r1"
        await _wait(pilot, lambda: "shared" in str(join.content))
        assert str(join.content).endswith(
            "\nor, where this run directory is shared: ddptui join /shared/runs/r1"
        )
        app.sessions[0].nodes_to_join = 0  # every node joined: the lines give their room back
        await _wait(pilot, lambda: not join.display)
        await pilot.press("s")
        await _wait(pilot, lambda: screen.source.done.is_set())
        await _wait(pilot, lambda: not join.display)  # the run is over: nothing to join


async def test_an_error_of_ddptuis_own_drawing_is_said_once_and_the_run_goes_on(
    tmp_path, monkeypatch
):
    """A drawing that raises (ddptui's own bug, here in the frame the header and table are
    drawn from) ended the app from its timer, and with it the live run. Now it is said once
    in a notification; the run goes on, and the other parts of the screen still draw."""
    from ddptui.tui.screens import run as run_module

    app = _app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("f5")
        source = await _started(pilot, app)
        screen = app.screen
        await _wait(pilot, lambda: screen.frame is not None)

        def broken(state, now):
            raise KeyError("boom")

        monkeypatch.setattr(run_module, "run_frame", broken)
        await _wait(pilot, lambda: "refresh_view" in screen.draw_errors)
        charts = screen._chart_tick
        await _wait(pilot, lambda: screen._chart_tick > charts + 2)  # still drawing
        notes = [n.message for n in app._notifications]
        assert len([n for n in notes if "ddptui's own error drawing" in n]) == 1
        assert "KeyError: 'boom'" in notes[-1] and "the run goes on" in notes[-1]
        assert not source.done.is_set() and app.sessions[0].calls == ["start"]
        assert app.is_running
        await pilot.press("s")
        await _wait(pilot, lambda: source.done.is_set())
