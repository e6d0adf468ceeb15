"""The dashboard's 'c' key: every rank's Flight Recorder trace asked for now, and what
torch's analyzer found shown (Pilot, a fake session: no processes)."""

from __future__ import annotations

import threading

from ddptui.run.config import build_config
from ddptui.run.diagnosis import Diagnosis
from ddptui.tui.screens.run import RunScreen
from tests.helpers import pilot_until
from tests.tui_fixtures.fakes import RUNS, FakeSession, fake_deps, primed_app

SIZE = (120, 40)
LINE = "rank 1 never entered all_reduce #17 (default_pg, 1 float) that rank 0 waits in"


class TracedSession(FakeSession):
    """A fake session whose ranks answer a trace request with one finding."""

    def __init__(self, cfg):
        super().__init__(cfg, hold=True)
        self.flight_note = None
        self.asked_from: list[str] = []

    def flight_check(self, now=None, record=True):
        self.asked_from.append(threading.current_thread().name)
        self.flight_note = "Flight Recorder: traces of ranks 0, 1"
        return [Diagnosis(1, "hang", LINE, 1.0)]


async def _wait(pilot, predicate, timeout: float = 10.0) -> None:
    await pilot_until(pilot, predicate, timeout)


async def test_c_asks_the_ranks_off_the_ui_thread_and_shows_the_finding(tmp_path):
    sessions: list[TracedSession] = []

    def factory(cfg):
        sessions.append(TracedSession(cfg))
        return sessions[-1]

    deps = fake_deps(runs_root=RUNS, session_factory=factory, refresh_hz=4.0, chart_hz=2.0)
    app = primed_app("run", deps=deps, raw={"run_dir": str(tmp_path / "r")})
    app.start_at_once = True
    app.cfg = build_config({"run_dir": str(tmp_path / "r"), "backend": "gloo"})
    async with app.run_test(size=SIZE) as pilot:
        await _wait(pilot, lambda: isinstance(app.screen, RunScreen))
        await _wait(pilot, lambda: app.screen.source.started.is_set())
        await pilot.press("c")
        await _wait(pilot, lambda: any(LINE in n.message for n in app._notifications))
        session = sessions[0]
        assert session.asked_from and session.asked_from[0] != threading.main_thread().name
        await pilot.press("s")
        await _wait(pilot, lambda: app.screen.source.done.is_set())
