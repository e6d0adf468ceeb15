"""The background Sampler: interval validation, latest/callback, pids, lifecycle."""

from __future__ import annotations

import os
import threading

import pytest

from ddptui.monitor import MIN_INTERVAL, NA, Sampler, SystemMonitor, validate_interval
from tests.fake_nvml import FakeGpu, FakeNvml


@pytest.mark.parametrize(
    ("interval", "ok"),
    [
        (1.0, True),
        (0.1, True),
        (5, True),
        ("0.5", True),
        (0.099, False),
        (0.0, False),
        (-1.0, False),
        (float("nan"), False),
        (float("inf"), False),
        ("fast", False),
        (None, False),
    ],
)
def test_interval_validation(interval, ok):
    if ok:
        assert validate_interval(interval) == float(interval)
        Sampler(interval=interval, nvml_module=FakeNvml())  # constructing starts nothing
    else:
        with pytest.raises(ValueError, match="monitor interval must be"):
            Sampler(interval=interval, nvml_module=FakeNvml())


def test_small_interval_message_says_the_minimum():
    with pytest.raises(ValueError) as info:
        validate_interval(0.01)
    assert str(info.value) == f"monitor interval must be at least {MIN_INTERVAL} s, got 0.01 s"


def test_sampler_delivers_snapshots_and_closes_nvml_it_opened():
    nvml = FakeNvml([FakeGpu(), FakeGpu(uuid="GPU-2")])
    seen = []
    threads = set()

    def on_snapshot(snap):
        seen.append(snap)
        threads.add(threading.current_thread().name)

    sampler = Sampler(interval=MIN_INTERVAL, callback=on_snapshot, nvml_module=nvml)
    assert sampler.latest() is None
    with sampler:
        assert sampler.running
        latest = sampler.wait_for(2, timeout=10)
    assert latest is not None and len(latest.gpus) == 2
    assert not sampler.running
    assert sampler.count == len(seen) >= 2
    assert sampler.latest() is seen[-1]
    assert [s.monotonic for s in seen] == sorted(s.monotonic for s in seen)
    assert latest.host.cpu_percent is not NA  # the sampler waited out the CPU warm-up
    assert threads == {"ddptui-monitor"}  # callbacks run on the sampler thread, not ours
    assert nvml.calls["nvmlInit"] == 1 and nvml.initialized == 0


def test_sampler_leaves_a_given_monitor_open_and_tracks_pids():
    nvml = FakeNvml([FakeGpu()])
    monitor = SystemMonitor(nvml)
    sampler = Sampler(monitor, interval=MIN_INTERVAL).start()
    try:
        first = sampler.wait_for(1, timeout=10)
        assert first.processes == ()
        sampler.set_pids([os.getpid()])
        n = sampler.count
        snap = sampler.wait_for(n + 1, timeout=10)
        assert [p.pid for p in snap.processes if p.pid == os.getpid()] == [os.getpid()]
    finally:
        sampler.stop()
    assert nvml.initialized == 1  # the caller owns the monitor
    monitor.close()
    assert nvml.initialized == 0


def test_a_failing_callback_does_not_stop_sampling(caplog):
    calls = []

    def explode(snap):
        calls.append(snap)
        raise RuntimeError("boom")

    with Sampler(interval=MIN_INTERVAL, callback=explode, nvml_module=FakeNvml()) as sampler:
        assert sampler.wait_for(2, timeout=10) is not None
    assert len(calls) >= 2
    assert "monitor callback failed" in caplog.text


def test_wait_for_times_out_and_stop_before_start():
    sampler = Sampler(interval=MIN_INTERVAL, nvml_module=FakeNvml())
    assert sampler.wait_for(1, timeout=0.01) is None
    sampler.stop()  # never started: fine
    assert not sampler.running


def test_stop_is_prompt_with_a_long_interval():
    import time

    sampler = Sampler(interval=60, nvml_module=FakeNvml()).start()
    sampler.wait_for(1, timeout=10)
    started = time.monotonic()
    sampler.stop()
    assert time.monotonic() - started < 2
