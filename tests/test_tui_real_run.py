"""The dashboard drives real 2-rank gloo runs (a user's own script under torchrun): the form
launches it, the table and charts show it to the end, and quitting leaves no process."""

from __future__ import annotations

import json
import os

import psutil
import pytest
from textual.widgets import Input, Select

from ddptui.run.machine import Machine
from ddptui.tui.app import Deps, create_app
from ddptui.tui.machine import HostInfo
from ddptui.tui.screens.confirm import ConfirmScreen
from ddptui.tui.screens.launch import OWN_SCRIPT, LaunchScreen
from ddptui.tui.screens.run import RunScreen
from ddptui.tui.sources import LiveSource
from tests.helpers import USER_SCRIPT, pilot_until, processes_of_run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

SIZE = (120, 40)
CPU_ONLY = HostInfo(Machine(0, "no CUDA here (test)", os.cpu_count() or 1), None)


def _app(tmp_path):
    deps = Deps(detect_host=lambda: CPU_ONLY, runs_root=tmp_path)
    return create_app("run", deps=deps, host_info=CPU_ONLY)


async def _fill_form(pilot, tmp_path, args: str) -> None:
    screen = pilot.app.screen
    assert isinstance(screen, LaunchScreen)
    screen.query_one("#f-trainer", Select).value = OWN_SCRIPT
    await pilot.pause()
    await pilot.click("#f-script")
    await pilot.press(*str(USER_SCRIPT))
    screen.query_one("#f-script_args", Input).value = args
    screen.query_one("#f-backend", Select).value = "gloo"
    screen.query_one("#f-run_dir", Input).value = str(tmp_path / "run")
    await pilot.pause()
    assert screen.validate() == []


def _leftovers(run_id: str) -> list[psutil.Process]:
    """This run's processes, and any launcher driver or rank still below this test process
    (other children, e.g. multiprocessing's resource tracker from earlier tests, are not
    the dashboard's)."""
    mine = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and "ddptui.run.launcher" in " ".join(
                proc.cmdline()
            ):
                mine.append(proc)
        except psutil.Error:
            continue
    return processes_of_run(run_id) + mine


async def test_form_launches_a_real_run_and_shows_it_to_the_end(tmp_path):
    app = _app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await _fill_form(pilot, tmp_path, "--steps 10")
        await pilot.press("f5")
        await pilot_until(pilot, lambda: isinstance(app.screen, RunScreen), 30)
        screen = app.screen
        source = screen.source
        assert isinstance(source, LiveSource)
        run_id = source.cfg.run_id
        await pilot_until(pilot, lambda: source.done.is_set(), 200)
        await pilot.pause(0.6)  # one more refresh after the end
        frame = screen.frame
        assert frame.status == "finished", source.error
        assert [(r.rank, r.state, r.epoch_step) for r in frame.rows] == [
            (0, "finished", "1/10"),
            (1, "finished", "1/10"),
        ]
        assert all(r.pid != "--" and r.host != "--" for r in frame.rows)
        assert "acc 1.0000" in frame.summary  # the script's all-reduced final accuracy
        await pilot.press("q")  # the run is over: no question asked
        await pilot.pause()
    assert app.return_code == 0
    assert _leftovers(run_id) == []


async def test_quitting_a_live_run_confirms_and_leaves_no_process(tmp_path):
    app = _app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await _fill_form(pilot, tmp_path, "--steps 100000 --sleep 0.05")
        await pilot.press("f5")
        await pilot_until(pilot, lambda: isinstance(app.screen, RunScreen), 30)
        source = app.screen.source
        run_id = source.cfg.run_id
        # Quit while the ranks are still starting: the harshest moment to tear down.
        await pilot_until(pilot, lambda: len(processes_of_run(run_id)) >= 2, 60)
        await pilot.press("q")
        await pilot_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), 30)
        await pilot.press("y")
        await pilot_until(pilot, lambda: source.done.is_set(), 60)
        await pilot.pause(0.3)
    assert source.result is not None and source.result.stopped
    assert _leftovers(run_id) == []
    # the app's exit code is the one summary.json records (130: stopped), as headless gives
    summary = json.loads((source.session.run_dir / "summary.json").read_text())
    assert app.exit_code() == summary["exit_code"] == 130
    assert app.return_value == 130  # what run_dashboard returns as the exit code
