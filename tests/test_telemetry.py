"""Reporter → collector over real ZeroMQ sockets."""

import subprocess
import sys
import textwrap
import threading
import time

import msgspec
import pytest
import zmq

from ddptui import protocol
from ddptui.rank.reporter import Reporter
from ddptui.run.collector import Collector
from ddptui.run.state import RunState


def drain(collector, want, timeout=10.0):
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        got += collector.poll(0.05)
    return got


@pytest.fixture
def collector():
    c = Collector("run-1")
    yield c
    c.close()


def test_tcp_collector_binds_loopback_on_a_free_port():
    with Collector("run-1", transport="tcp") as collector:
        assert collector.endpoint.startswith("tcp://127.0.0.1:")
        assert not collector.endpoint.endswith(":0")


def test_a_step_is_made_and_sent_by_the_sender_thread_within_the_interval(collector, monkeypatch):
    made_on = []
    real_make = Reporter._make_steps

    def spy(self):
        if self._steps:
            made_on.append(threading.current_thread().name)
        real_make(self)

    monkeypatch.setattr(Reporter, "_make_steps", spy)
    rep = Reporter(collector.endpoint, "run-1", rank=0)
    try:
        rep.log(loss=1.0, samples=8)  # started goes at once, the step within the interval
        logged = time.monotonic()
        assert made_on == []  # nothing made on the caller's thread
        events = drain(collector, 2, timeout=5.0)
        took = time.monotonic() - logged
        rep.log(loss=0.5, samples=8)
        events += drain(collector, 1, timeout=5.0)
    finally:
        rep.close()
    assert [type(e).__name__ for e in events] == ["Status", "Step", "Step"]
    assert [e.seq for e in events] == [0, 1, 2]
    assert made_on == ["ddptui-telemetry", "ddptui-telemetry"]
    assert took < 2.0  # FLUSH_INTERVAL_S (0.2 s) on a quiet machine; no later call needed


def test_other_events_go_at_once_after_the_steps_logged_before_them(collector):
    rep = Reporter(collector.endpoint, "run-1", rank=0)
    try:
        rep._sender.stop()  # no thread: only the eval can take the step along
        rep.log(loss=1.0, samples=8)
        assert [type(e).__name__ for e in drain(collector, 1, timeout=1.0)] == ["Status"]
        assert collector.poll(0.1) == []
        rep.log_eval(accuracy=0.5)  # not a step: goes at once, the waiting step first
        events = drain(collector, 2, timeout=2.0)
    finally:
        rep.close()
    assert [(type(e).__name__, e.seq) for e in events] == [("Step", 1), ("Eval", 2)]


def test_steps_piling_up_unsent_are_made_and_sent_on_the_callers_thread(collector, monkeypatch):
    monkeypatch.setattr("ddptui.rank.reporter.MAX_QUEUED_STEPS", 4)
    rep = Reporter(collector.endpoint, "run-1", rank=0)
    try:
        rep._sender.stop()  # a thread starved of the GIL never drains
        for i in range(4):
            rep.log(loss=float(i), samples=8)
        events = drain(collector, 5, timeout=5.0)
        assert len(rep._steps) == 0
    finally:
        rep.close()
    assert [e.loss for e in events[1:]] == [0.0, 1.0, 2.0, 3.0]
    assert [e.seq for e in events] == list(range(5))


def test_steps_are_derived_and_delivered_in_order(collector):
    rep = Reporter(collector.endpoint, "run-1", rank=3)
    try:
        rep.log(epoch=1, loss=2.0, samples=8)
        time.sleep(0.01)
        rep.log(epoch=1, loss=1.0, samples=8, lr=0.5)
        rep.log_eval(accuracy=0.5, loss=0.7, count=10)
        rep.finished()
        events = drain(collector, 6)
    finally:
        rep.close()
    kinds = [type(e).__name__ for e in events]
    assert kinds == ["Status", "Step", "Step", "EpochEnd", "Eval", "Status"]
    assert [e.seq for e in events] == list(range(6))
    started, s1, s2, epoch_end, evaluation, finished = events
    assert started.state == "started" and started.rank == 3 and started.pid > 0
    assert (s1.step, s2.step) == (1, 2)
    assert s1.step_time is None and s2.step_time >= 0.01
    assert s2.samples_per_s == pytest.approx(8 / s2.step_time)
    assert s2.metrics == {"lr": 0.5}
    assert (epoch_end.epoch, epoch_end.samples) == (1, 16)
    assert (evaluation.epoch, evaluation.accuracy, evaluation.count) == (1, 0.5, 10)
    assert finished.state == "finished" and finished.dropped == 0


def test_each_epoch_ends_exactly_once(collector):
    rep = Reporter(collector.endpoint, "run-1", rank=0)
    try:
        for epoch in (1, 2):
            rep.log(epoch=epoch, loss=1.0, samples=4)
            rep.log(epoch=epoch, loss=1.0, samples=4)
            rep.log_eval(epoch=epoch, accuracy=0.5)
        rep.finished()
        # started, 4 steps, 2 evals, 2 epoch ends, finished: waiting for more took the timeout
        events = drain(collector, 10)
    finally:
        rep.close()
    assert len(events) == 10
    ends = [(e.epoch, e.samples) for e in events if type(e).__name__ == "EpochEnd"]
    assert ends == [(1, 8), (2, 8)]


def test_the_first_epoch_is_timed_from_its_first_steps_start_where_that_is_known(collector):
    rep = Reporter(collector.endpoint, "run-1", rank=0)
    try:
        rep.log(epoch=0, loss=1.0, samples=4, step_time=30.0)  # the run's first step
        time.sleep(0.01)
        rep.log(epoch=0, loss=1.0, samples=4)
        time.sleep(0.01)
        rep.log(epoch=1, loss=1.0, samples=4, step_time=0.5)  # timed from the last step's end
        rep.log_eval(epoch=1, accuracy=0.5)
        rep.finished()
        events = drain(collector, 7)
    finally:
        rep.close()
    ends = [e for e in events if type(e).__name__ == "EpochEnd"]
    assert [(e.epoch, e.samples) for e in ends] == [(0, 8), (1, 4)]
    assert 30.01 <= ends[0].time < 31.0
    assert 0.01 <= ends[1].time < 0.5


def test_started_is_sent_again_only_when_it_tells_something_new(collector):
    rep = Reporter(collector.endpoint, "run-1", rank=0)
    try:
        rep.started(device="cpu", epochs=3)
        rep.started(device="cpu", epochs=3)  # nothing new: not sent
        rep.started(steps_per_epoch=125)
        rep.log(loss=1.0, samples=1)  # a step does not announce again
        rep.flush()
        events = drain(collector, 3)
    finally:
        rep.close()
    started = [e for e in events if type(e).__name__ == "Status"]
    assert [(e.epochs, e.steps_per_epoch, e.device) for e in started] == [
        (3, None, "cpu"),
        (3, 125, "cpu"),
    ]


def test_no_endpoint_is_a_no_op():
    rep = Reporter(None, "run", rank=0)
    rep.log(loss=1.0, samples=1)
    rep.log_eval(accuracy=1.0)
    rep.finished()
    assert (rep.sent, rep.dropped, rep.enabled) == (0, 0, False)


def test_nobody_listening_never_blocks_and_counts_drops():
    with zmq.Context() as ctx, ctx.socket(zmq.PULL) as probe:
        port = probe.bind_to_random_port("tcp://127.0.0.1")
    # The port is closed again: nobody listens there.
    rep = Reporter(f"tcp://127.0.0.1:{port}", "run", rank=0, send_hwm=10)
    try:
        n = 30_000  # well past the send HWM: a blocking send would hang here
        for _ in range(n):
            rep.log(loss=1.0, samples=1)
        rep.flush()
    finally:
        rep.close()
    # Nothing was queued for a peer that never came (so closing has nothing to linger on);
    # every event, the started status included, is counted as dropped.
    assert (rep.sent, rep.dropped) == (0, n + 1)


def test_flooding_drops_are_counted_and_visible_as_seq_gaps():
    collector = Collector("run-1", receive_hwm=5)
    rep = Reporter(collector.endpoint, "run-1", rank=0, send_hwm=5)
    n = 200_000  # the collector is not reading: HWMs and socket buffers fill, the rest drops
    try:
        for i in range(n):
            rep.log(loss=float(i), samples=1)
        rep.flush()
        rep_sent, rep_dropped = rep.sent, rep.dropped
        events = drain(collector, rep_sent, timeout=20)
    finally:
        rep.close()
        collector.close()
    assert rep_dropped > 0
    assert len(events) == rep_sent
    assert rep_sent + rep_dropped == n + 1
    state = RunState("run-1", 1)
    for e in events:
        state.apply(e, now=0.0)
    # Every drop is accounted for exactly: inside the stream as a seq gap, at the very end
    # as the seq numbers after the last event received (the last event made has seq n).
    assert state.ranks[0].gaps + (n - events[-1].seq) == rep_dropped


def test_garbage_foreign_and_oversized_are_counted_and_ignored(collector):
    with zmq.Context() as ctx, ctx.socket(zmq.PUSH) as push:
        push.connect(collector.endpoint)
        push.send(b"\xff\x00garbage")
        push.send(msgspec.msgpack.encode([{"kind": "step", "run": "run-1"}]))
        push.send(
            protocol.encode_batch([protocol.Step(run="other-run", rank=0, t=0, seq=0, step=1)])
        )
        push.send(b"\x00" * (protocol.MAX_MESSAGE_BYTES + 10))
        push.send(protocol.encode_batch([protocol.Step(run="run-1", rank=0, t=0, seq=0, step=1)]))
        events = drain(collector, 1)
    assert len(events) == 1 and events[0].step == 1
    stats = collector.stats
    assert (stats.malformed, stats.foreign, stats.oversized, stats.received) == (2, 1, 1, 1)


def test_unhandled_exception_in_a_script_reports_failed_status(collector, tmp_path):
    script = tmp_path / "crash.py"
    script.write_text(
        textwrap.dedent("""
        import ddptui
        ddptui.log(loss=1.0, samples=1)
        raise ValueError("bad batch")
    """)
    )
    env = {
        "DDPTUI_ENDPOINT": collector.endpoint,
        "DDPTUI_RUN_ID": "run-1",
        "RANK": "1",
        "PATH": "/usr/bin:/bin",
    }
    proc = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1 and "ValueError: bad batch" in proc.stderr
    events = drain(collector, 3)
    assert [getattr(e, "state", None) for e in events] == ["started", None, "failed"]
    assert events[-1].error == "ValueError: bad batch" and events[-1].rank == 1


def test_import_ddptui_is_light():
    code = (
        "import sys, ddptui; ddptui.log(loss=1.0); "
        "print(sorted(m for m in ('torch', 'textual', 'zmq') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert out.stdout.strip() == "[]", out.stderr
