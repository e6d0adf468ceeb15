"""The bench in the dashboard: progress, the table and the samples/s chart, driven by fake
sessions (no process); quitting stops the run in progress and keeps the results."""

from __future__ import annotations

import csv
import time

import pytest
from rich.console import Console
from textual.widgets import ProgressBar, Static

from ddptui.runs import bench
from ddptui.tui.screens.bench import BenchApp, BenchScreen, SamplesChart
from tests.test_bench import NO_CUDA, FakeSampler, FakeSession, _args

pytestmark = pytest.mark.waits  # mostly waits on timers: run beside real runs (tests/conftest.py)


def _opts(tmp_path, *argv):
    argv = ["--world-size", "1,2", "--amp", "off,fp16", "--bench-dir", str(tmp_path), *argv]
    return bench.plan_bench(_args(argv), NO_CUDA)


async def _until(pilot, predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await pilot.pause(0.05)


async def test_bench_screen_runs_the_matrix_and_charts_it(tmp_path):
    sessions = []

    def factory(cfg):
        sessions.append(FakeSession(cfg, world=cfg.world_size))
        return sessions[-1]

    opts = _opts(tmp_path, "--steps", "40")  # enough steps for an interval
    app = BenchApp(opts, session_factory=factory, sampler_factory=FakeSampler)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen
        assert isinstance(screen, BenchScreen)
        await _until(pilot, screen.done.is_set)
        await pilot.pause(0.6)  # one more redraw
        assert screen.code == 0 and len(sessions) == 2
        shown = screen.table_rows(screen.runner.rows())
        assert [c[1] for c in shown] == ["measured", "measured", "skipped", "skipped"]
        assert shown[0][:3] == ("x1 spawn gloo amp off", "measured", "800 ±0%")
        assert shown[1][:5] == ("x2 spawn gloo amp off *", "measured", "1,600 ±0%", "100%", "1.0s")
        assert shown[2][6].startswith("AMP fp16 needs a CUDA GPU")
        assert screen.now_line().startswith("bench done — results in")
        bar = screen.query_one(ProgressBar)
        assert bar.progress == bar.total == 2  # every run done: a full bar (it stood at 2/3)
        assert screen.query_one(SamplesChart).plt is not None
        await pilot.press("q")
    assert app.return_value == 0
    rows = list(csv.DictReader((tmp_path / "bench.csv").open()))
    assert [r["status"] for r in rows] == ["measured", "measured", "skipped", "skipped"]
    assert all(s.calls == ["start", "stop", "close"] for s in sessions)


async def test_quitting_stops_the_run_in_progress_and_keeps_results(tmp_path):
    sessions = []

    class Slow(FakeSession):
        def pump(self, timeout):
            time.sleep(0.02)
            super().pump(timeout)

    def factory(cfg):
        sessions.append(Slow(cfg, world=cfg.world_size))
        return sessions[-1]

    opts = _opts(tmp_path, "--steps", "100000")
    app = BenchApp(opts, session_factory=factory, sampler_factory=FakeSampler)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen
        await _until(pilot, lambda: sessions and sessions[0]._step > 10)
        assert screen.now_line().startswith("run 1/2: x1 spawn gloo amp off: step ")
        assert screen.table_rows(screen.runner.rows())[0][1] == "running"
        await pilot.press("q")
        await _until(pilot, screen.done.is_set)
    assert app.return_value == 130
    assert len(sessions) == 1 and sessions[0].calls == ["start", "stop-interrupted", "close"]
    rows = list(csv.DictReader((tmp_path / "bench.csv").open()))
    assert [r["status"] for r in rows] == ["interrupted", "not run", "skipped", "skipped"]


def test_the_dashboard_marks_unstable_figures_and_says_why_there_is_no_efficiency(tmp_path):
    from tests.test_bench_stability import _measured, _noisy, _tight

    screen = BenchScreen(_opts(tmp_path, "--steps", "100"))
    one, two = screen.runner.results[:2]
    one.runs.append(_measured(_noisy(seed=3), ranks=1))
    two.runs.append(_measured(_tight(), ranks=2))
    rows = screen.runner.rows()
    shown = screen.table_rows(rows)
    assert shown[0][2].endswith("unstable") and "unstable" not in shown[1][2]
    assert shown[1][3].startswith("-- (x1 unstable (±")
    assert [r.stable for r in rows[:2]] == [False, True]


async def test_a_narrow_terminal_leaves_first_step_and_rss_to_bench_md(tmp_path):
    """At 80 columns every column was cut to a few characters ("5,767 no interval …")."""
    opts = _opts(tmp_path, "--steps", "40")
    app = BenchApp(
        opts,
        session_factory=lambda cfg: FakeSession(cfg, world=cfg.world_size),
        sampler_factory=FakeSampler,
    )
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.screen
        await _until(pilot, screen.done.is_set)
        await pilot.pause(0.6)
        table = screen.query_one("#bench-table", Static).content
        headers = [c.header for c in table.columns]
        assert headers == [
            "configuration",
            "state",
            "samples/s",
            "efficiency",
            "accuracy / why not",
        ]
        # Every column keeps a share of the width, the state whole and the accuracy in view:
        # an unstable figure's long notes pushed the accuracy off the screen ("mea…").
        noisy = ("x1 spawn gloo amp off", "measured", "7,387 no interval unstable")
        noisy += ("-- (x1 unstable (no interval))", "3.5s", "693 MiB", "0.991")
        screen.table_rows = lambda rows: [noisy]
        screen.redraw()
        console = Console(width=screen.query_one("#bench-table").size.width, record=True)
        console.print(screen.query_one("#bench-table", Static).content)
        text = console.export_text()
        assert "accuracy" in text and "measured" in text and "0.991" in text, text
        await pilot.resize_terminal(120, 40)
        await pilot.pause(0.6)
        table = screen.query_one("#bench-table", Static).content
        assert "peak RSS/rank" in [c.header for c in table.columns]
        await pilot.press("q")
