"""``s`` in the dashboard asks a built-in trainer's ranks to stop with a checkpoint (fakes only);
the run ends ``stopped`` and the header shows how to continue it."""

from __future__ import annotations

from ddptui.run.launcher import LaunchResult
from ddptui.tui.screens.run import RunScreen
from ddptui.tui.sources import LiveSource
from tests.helpers import pilot_until
from tests.tui_fixtures.fakes import RUNS, FakeSession, fake_deps, primed_app

SIZE = (120, 40)


class CheckpointStopSession(FakeSession):
    """Stops "with a checkpoint": the next poll ends the run as the trainers would."""

    asked = False

    def can_stop_with_checkpoint(self) -> bool:
        return True

    def stop_with_checkpoint(self) -> bool:
        self._record("stop_with_checkpoint")
        self.asked = True
        return True

    def stop_overdue(self) -> bool:
        return False

    def poll(self):
        if self.asked and self.result is None:
            (self.run_dir / "checkpoint.pt").write_bytes(b"PK")
            self.result = LaunchResult(0)
            with self._lock:
                self.state.set_outcome("stopped", now=self.clock())
        return super().poll()


def _app(tmp_path):
    sessions = []

    def factory(cfg):
        sessions.append(CheckpointStopSession(cfg))
        sessions[-1].run_dir = tmp_path / "r"
        sessions[-1].run_dir.mkdir(exist_ok=True)
        return sessions[-1]

    deps = fake_deps(runs_root=RUNS, session_factory=factory, refresh_hz=4.0, chart_hz=2.0)
    app = primed_app("run", deps=deps, raw={"run_dir": str(tmp_path / "r")})
    app.sessions = sessions
    return app


async def _wait(pilot, predicate, timeout: float = 5.0) -> None:
    await pilot_until(pilot, predicate, timeout)


async def test_s_stops_with_a_checkpoint_and_shows_how_to_resume(tmp_path):
    app = _app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("f5")
        await _wait(pilot, lambda: isinstance(app.screen, RunScreen))
        screen = app.screen
        source = screen.source
        assert isinstance(source, LiveSource)
        await _wait(pilot, lambda: source.started.is_set())
        await pilot.press("s")
        await _wait(pilot, lambda: source.done.is_set())
        assert app.sessions[0].calls == ["start", "stop_with_checkpoint", "close"]
        await _wait(pilot, lambda: screen.frame.status == "stopped")
        assert screen.note() == f"to continue: ddptui --resume {tmp_path / 'r'}"
        title = str(screen.query_one("#run-title").render())
        assert "STOPPED" in title and "ddptui --resume" in title
