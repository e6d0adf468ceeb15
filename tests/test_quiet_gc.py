"""The garbage collector of the process that applies a run's events (a live run's session,
``ddptui attach``): collected less often, and left alone where someone chose otherwise.
No processes started."""

import gc
import shutil

import pytest

from ddptui.run import quiet_gc
from ddptui.run import session as session_module
from ddptui.run.config import build_config
from ddptui.run.launcher import LaunchResult
from ddptui.run.machine import Machine
from ddptui.run.quiet_gc import GC_YOUNG_THRESHOLD, quiet_collector
from ddptui.run.session import RunSession
from ddptui.tui.follow import FollowSource
from tests.data_fixtures.record import RUNS

CPU = Machine(0, "no GPU", 2)


@pytest.fixture(autouse=True)
def collector_restored():
    threshold, enabled = gc.get_threshold(), gc.isenabled()
    yield
    gc.set_threshold(*threshold)
    (gc.enable if enabled else gc.disable)()


def test_the_young_generation_is_collected_less_often_and_the_older_ones_as_set():
    gc.set_threshold(700, 7, 9)
    quiet_collector()
    assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, 7, 9)
    assert gc.isenabled()


@pytest.mark.parametrize(
    "threshold, enabled",
    [
        ((GC_YOUNG_THRESHOLD * 5, 10, 10), True),  # a higher threshold someone chose
        ((0, 10, 10), True),  # threshold 0: collection off
        ((700, 10, 10), False),  # gc.disable()
    ],
)
def test_a_collector_set_otherwise_is_left_as_it_is(threshold, enabled):
    gc.set_threshold(*threshold)
    (gc.enable if enabled else gc.disable)()
    quiet_collector()
    assert gc.get_threshold() == threshold
    assert gc.isenabled() is enabled


class Held:
    """An object the collector tracks."""


def test_what_the_process_holds_at_the_first_call_only_is_frozen(monkeypatch):
    monkeypatch.setattr(quiet_gc, "_frozen", False)
    before = Held()
    quiet_collector()
    after = Held()
    quiet_collector()
    tracked = gc.get_objects()
    assert not any(obj is before for obj in tracked)  # frozen: no full collection scans it
    assert any(obj is after for obj in tracked)  # a later call froze nothing more


class IdleLauncher:
    """Starts nothing; ended at once when stopped."""

    def start(self) -> None:
        pass

    def poll(self) -> LaunchResult | None:
        return None

    def stop(self, grace: float | None = None) -> LaunchResult:
        return LaunchResult(0, stopped=True)


def test_a_run_session_quiets_the_collector_once_its_ranks_are_launched(tmp_path, monkeypatch):
    launched_at = []
    launcher = IdleLauncher()
    launcher.start = lambda: launched_at.append(gc.get_threshold()[0])  # type: ignore[method-assign]
    monkeypatch.setattr(session_module, "make_launcher", lambda cfg, endpoint: launcher)
    gc.set_threshold(700, 10, 10)
    cfg = build_config({"run_dir": str(tmp_path / "run"), "world_size": "1"}, CPU)
    with RunSession(cfg) as session:
        session.start()
        assert gc.get_threshold()[0] == GC_YOUNG_THRESHOLD
    # The launch itself ran with the threshold as it was (its processes are exec'd anyway).
    assert launched_at == [700]


def test_following_another_processs_run_quiets_the_collector_too(tmp_path):
    run = tmp_path / "followed"
    run.mkdir()
    shutil.copy(RUNS / "amp-off" / "config.json", run / "config.json")
    (run / "events.jsonl").write_bytes(b"")
    gc.set_threshold(700, 10, 10)
    source = FollowSource(run, alive=lambda run_id: True)
    assert gc.get_threshold()[0] == 700  # reading a run does not
    source.start()
    try:
        assert gc.get_threshold()[0] == GC_YOUNG_THRESHOLD
    finally:
        source.close()
