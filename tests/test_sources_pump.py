"""When the dashboard's driving thread pumps a live run: once a frame while a screen draws it
(each pump then takes what came since the last frame, and the frame shows it), every 50 ms
where none does; a stop asked for is never kept waiting."""

from __future__ import annotations

import threading
import time

import pytest

from ddptui import protocol
from ddptui.run.config import build_config
from ddptui.run.launcher import LaunchResult
from ddptui.run.state import RunState
from ddptui.tui import sources
from ddptui.tui.sources import LiveSource

pytestmark = pytest.mark.waits


class StubSession:
    """A RunSession stand-in whose socket holds what the test puts there (``arrive``), or,
    with ``flowing``, a new step at every pump, as a busy run's does."""

    def __init__(self, cfg, flowing: bool = False) -> None:
        self.cfg = cfg
        self.run_dir = None
        self.clock = time.monotonic
        self.state = RunState(cfg.run_id, cfg.world_size)
        self.flowing = flowing
        self.queued: list[protocol.Step] = []
        self.arrived = threading.Condition()
        #: (timeout, events taken) of every pump, in order.
        self.pumps: list[tuple[float, int]] = []
        self.result: LaunchResult | None = None
        self._lock = threading.RLock()
        self._step = 0

    def step(self) -> protocol.Step:
        self._step += 1
        return protocol.Step(
            run=self.cfg.run_id, rank=0, t=time.time(), seq=self._step, step=self._step
        )

    def arrive(self, event: protocol.Step) -> None:
        with self.arrived:
            self.queued.append(event)
            self.arrived.notify_all()

    def start(self) -> None:
        pass

    def pump(self, timeout: float = 0.1) -> list[protocol.Step]:
        with self.arrived:
            if self.flowing:
                self.queued.append(self.step())
            if not self.queued:
                self.arrived.wait(timeout)  # a socket's wait: nothing come yet
            events, self.queued = self.queued, []
        with self._lock:
            for event in events:
                self.state.apply(event, self.clock())
        self.pumps.append((timeout, len(events)))
        return events

    def poll(self) -> LaunchResult | None:
        return self.result

    def stop(self, interrupted: bool = False, exit_code: int | None = None) -> LaunchResult:
        self.result = self.result or LaunchResult(-15, stopped=True)
        return self.result

    def close(self) -> None:
        pass

    def locked(self):
        return self._lock


def _driven(tmp_path, flowing: bool = False) -> tuple[LiveSource, StubSession, threading.Thread]:
    cfg = build_config({"run_dir": str(tmp_path / "r"), "backend": "gloo"})
    source = LiveSource(cfg, lambda c: StubSession(c, flowing))
    thread = threading.Thread(target=source.drive, daemon=True)
    thread.start()
    assert source.started.wait(5)
    return source, source.session, thread


def _frames(source: LiveSource, seconds: float, hz: float = 5.0) -> int:
    """Draw frames as the run screen does (each first catching up), for ``seconds``."""
    frames, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        source.catch_up()
        frames += 1
        time.sleep(1 / hz)
    return frames


def _end(source: LiveSource, thread: threading.Thread) -> None:
    source.request_stop()
    thread.join(5)
    assert not thread.is_alive()


def test_a_frame_shows_every_event_that_came_before_it(tmp_path):
    source, session, thread = _driven(tmp_path, flowing=True)
    try:
        _frames(source, 0.6)  # a busy run: the driver waits for the next frame between pumps
        assert source._parked
        session.arrive(session.step())
        session.arrive(session.step())
        source.catch_up()
        with source.locked():  # what the frame drawn now reads
            assert source.state.ranks[0].step == session._step
        assert not session.queued
        assert session.pumps[-1] == (0.0, 3)  # asked for: what was there, no wait for more
    finally:
        _end(source, thread)


def test_while_a_screen_draws_a_busy_run_the_driver_pumps_about_once_a_frame(tmp_path):
    source, session, thread = _driven(tmp_path, flowing=True)
    try:
        _frames(source, 0.6)  # settle into the frames' pace
        before = len(session.pumps)
        frames = _frames(source, 2.0)
        pumps = len(session.pumps) - before
    finally:
        _end(source, thread)
    # A pump a frame (and one more where a frame's wait ran out); every 50 ms it was 40.
    assert frames <= pumps <= 2 * frames + 2, (frames, pumps)


def test_where_no_screen_draws_pumps_keep_the_pace_of_a_batch_each(tmp_path):
    source, session, thread = _driven(tmp_path, flowing=True)
    try:
        time.sleep(1.0)
    finally:
        _end(source, thread)
    # every PUMP_MIN_INTERVAL_S (20 a second), never parked for a frame that is not coming
    assert 1.0 / sources.PUMP_PARK_S < len(session.pumps) <= 1.0 / sources.PUMP_MIN_INTERVAL_S + 2


def test_a_stop_asked_for_wakes_a_driver_waiting_for_the_next_frame(tmp_path):
    source, session, thread = _driven(tmp_path, flowing=True)
    _frames(source, 0.6)
    assert source._parked
    asked = time.monotonic()
    source.request_stop()
    thread.join(5)
    assert not thread.is_alive()
    assert time.monotonic() - asked < sources.PUMP_PARK_S / 2
    assert source.result is not None and source.result.stopped


def test_a_frame_does_not_wait_on_a_quiet_run(tmp_path):
    """Nothing came: the driver waits on the socket, not for a frame, and a frame draws at
    once."""
    source, session, thread = _driven(tmp_path)
    try:
        time.sleep(0.3)
        assert not source._parked
        began = time.monotonic()
        source.catch_up()
        assert time.monotonic() - began < sources.CATCH_UP_S / 2
    finally:
        _end(source, thread)


def test_a_frame_waits_no_longer_than_its_bound_for_a_slow_pump(tmp_path, monkeypatch):
    source, session, thread = _driven(tmp_path, flowing=True)
    try:
        _frames(source, 0.6)
        assert source._parked
        slow = threading.Event()
        original = session.pump

        def pump(timeout: float = 0.1):
            slow.wait(2)  # a diagnosis that takes its time, say
            return original(timeout)

        monkeypatch.setattr(session, "pump", pump)
        began = time.monotonic()
        source.catch_up(timeout=0.1)
        assert time.monotonic() - began < 1.0
        slow.set()
    finally:
        _end(source, thread)
