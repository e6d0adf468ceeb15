"""Values logged as tensors: CPU ones read at once, CUDA ones read lazily (never waiting for
the device), in the reporter's pending queue; and a dead listener that costs nothing.

The CUDA path is covered without CUDA by a fake device value whose "event" completes when
the test says so; the real one runs under the ``gpu`` marker.
"""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
import tempfile
import time
import types
import warnings

import pytest
import zmq

from ddptui import protocol
from ddptui.rank import pending
from ddptui.rank.reporter import HOLD_EVENTS, Reporter
from ddptui.run.collector import Collector
from ddptui.run.state import RunState


def drain(collector, want, timeout=10.0):
    """What arrives until ``want`` events have (``"finished"``: until the rank's finished
    Status, the last it sends) or ``timeout``."""
    got = []
    deadline = time.monotonic() + timeout

    def done():
        if want == "finished":
            return any(getattr(e, "state", None) == "finished" for e in got)
        return len(got) >= want

    while not done() and time.monotonic() < deadline:
        got += collector.poll(0.05)
    return got


@pytest.fixture
def collector():
    c = Collector("run-1")
    yield c
    c.close()


# -- the pending queue, with fake reads ------------------------------------------------------
class FakeRead:
    """A read in flight: ``query()`` is False until ``done`` is set (or after ``polls``)."""

    def __init__(self, values, polls=None, error=None):
        self._values = list(values.items())
        self.done = False
        self._polls = polls
        self._error = error
        self.queries = 0

    def query(self):
        self.queries += 1
        if self._error is not None:
            raise self._error
        if self._polls is not None and self.queries >= self._polls:
            self.done = True
        return self.done

    def values(self):
        return list(self._values)

    def keys(self):
        return [k for k, _ in self._values]


def test_items_without_reads_leave_at_once_in_order():
    q = pending.PendingQueue()
    q.push("a")
    q.push("b")
    assert q.pop_ready() == [("a", None), ("b", None)]
    assert not q


def test_a_read_in_flight_holds_back_later_items_until_its_event_completes():
    q = pending.PendingQueue()
    read = FakeRead({"loss": 0.25})
    q.push("step-1", read)
    q.push("step-2")
    q.push("eval", FakeRead({"accuracy": 0.5}, polls=1))  # already complete when asked
    assert q.pop_ready() == []  # nothing overtakes step-1
    assert len(q) == 3
    read.done = True
    assert q.pop_ready() == [
        ("step-1", [("loss", 0.25)]),
        ("step-2", None),
        ("eval", [("accuracy", 0.5)]),
    ]
    assert (q.dropped, q.failed) == (0, 0)


def test_a_full_queue_drops_the_oldest_and_counts_it():
    q = pending.PendingQueue(capacity=2)
    reads = [FakeRead({"loss": float(i)}) for i in range(4)]
    assert [q.push(i, r) for i, r in enumerate(reads)] == [0, 0, 1, 1]
    assert q.dropped == 2 and len(q) == 2
    for r in reads:
        r.done = True
    assert q.pop_ready() == [(2, [("loss", 2.0)]), (3, [("loss", 3.0)])]


def test_a_read_that_fails_loses_its_values_not_its_place():
    q = pending.PendingQueue()
    q.push("broken", FakeRead({"loss": 1.0}, error=RuntimeError("CUDA error")))
    q.push("next")
    assert q.pop_ready() == [("broken", [("loss", None)]), ("next", None)]
    assert q.failed == 1


def test_drain_waits_for_reads_and_gives_up_at_its_deadline():
    q = pending.PendingQueue()
    q.push("soon", FakeRead({"loss": 1.5}, polls=3))
    q.push("never", FakeRead({"loss": 2.5}))
    out = q.drain(timeout=0.05, poll=0.001)
    assert out == [("soon", [("loss", 1.5)]), ("never", [("loss", None)])]
    assert (len(q), q.failed) == (0, 1)


def test_capacity_must_be_positive():
    with pytest.raises(ValueError):
        pending.PendingQueue(capacity=0)


# -- DeviceRead and DeviceTiming against a fake torch (the CUDA code without CUDA) ----------
@dataclasses.dataclass(frozen=True)
class FakeDevice:
    type: str
    index: int | None = None


class FakeTorchTensor:
    def __init__(self, value, device=FakeDevice("cuda", 0), shape=(), dtype="float32"):
        self.value, self.device, self.shape, self.dtype = value, device, shape, dtype
        self.detached = False
        self.pinned = False
        self.copied_from = None

    def numel(self):
        return math.prod(self.shape)

    def detach(self):
        out = FakeTorchTensor(self.value, self.device, self.shape, self.dtype)
        out.detached = True
        return out

    def reshape(self, shape):
        out = FakeTorchTensor(self.value, self.device, shape, self.dtype)
        out.detached = self.detached
        return out

    def copy_(self, src, non_blocking=False):
        assert non_blocking and self.pinned and src.detached and src.shape == ()
        self.copied_from, self.value = src, src.value
        return self

    def item(self):
        return self.value


class FakeEvent:
    def __init__(self, enable_timing=False):
        self.enable_timing = enable_timing
        self.stream = "not recorded"
        self.done = False
        self.at = 0.0

    def record(self, stream=None):
        self.stream = stream

    def query(self):
        return self.done

    def elapsed_time(self, end):  # milliseconds, as torch.cuda.Event.elapsed_time
        return end.at - self.at


@pytest.fixture
def fake_torch(monkeypatch):
    events: list[FakeEvent] = []

    def make_event(enable_timing=False):
        events.append(FakeEvent(enable_timing))
        return events[-1]

    def empty(shape, dtype=None, pin_memory=False):
        host = FakeTorchTensor(None, FakeDevice("cpu"), shape, dtype)
        host.pinned = pin_memory
        return host

    fake = types.SimpleNamespace(
        Tensor=FakeTorchTensor,
        empty=empty,
        cuda=types.SimpleNamespace(
            Event=make_event, current_stream=lambda device: ("stream of", device)
        ),
    )
    monkeypatch.setitem(sys.modules, "torch", fake)
    return events


def test_device_read_copies_into_pinned_memory_behind_one_event_per_device(fake_torch):
    loss = FakeTorchTensor(0.5)
    count = FakeTorchTensor(3, FakeDevice("cuda", 1), shape=(1,), dtype="int64")
    acc = FakeTorchTensor(0.75)
    assert pending.on_device(loss) and not pending.on_device(
        FakeTorchTensor(1.0, FakeDevice("cpu"))
    )
    read = pending.DeviceRead([("loss", loss), (("metric", "n"), count), ("accuracy", acc)])
    # One event per device, recorded on that device's current stream after its copies.
    assert [e.stream for e in fake_torch] == [
        ("stream of", FakeDevice("cuda", 0)),
        ("stream of", FakeDevice("cuda", 1)),
    ]
    assert not read.query()
    fake_torch[0].done = True
    assert not read.query()  # the copy on cuda:1 has not landed yet
    fake_torch[1].done = True
    assert read.query()
    assert read.values() == [("loss", 0.5), (("metric", "n"), 3), ("accuracy", 0.75)]
    assert read.keys() == ["loss", ("metric", "n"), "accuracy"]


def test_device_read_refuses_a_tensor_of_many_values(fake_torch):
    with pytest.raises(ValueError, match=r"loss must be .* shape \(2,\)"):
        pending.DeviceRead([("loss", FakeTorchTensor(0.5, shape=(2,)))])


def test_device_timing_reads_the_elapsed_time_once_its_stop_has_completed(fake_torch):
    q = pending.PendingQueue()
    timing = pending.DeviceTiming("backward_s").start()
    assert not timing.query()  # not stopped yet
    q.push("phase", timing.stop(stream="s1"))
    start, stop = fake_torch
    assert start.enable_timing and stop.enable_timing and stop.stream == "s1"
    stop.at = 12.5
    assert q.pop_ready() == []
    stop.done = True
    assert q.pop_ready() == [("phase", [("backward_s", 0.0125)])]


# -- the reporter with fake CUDA values ------------------------------------------------------
class FakeCuda:
    """Stands in for a one-element CUDA tensor."""

    class device:  # noqa: N801 - mimics torch.device
        type = "cuda"

    is_cuda = True
    shape = ()

    def __init__(self, value):
        self.value = value

    def numel(self):
        return 1

    def __float__(self):  # reading it now would wait for the GPU: the reporter must not
        raise AssertionError("a CUDA value was read on the step path")


@pytest.fixture
def fake_cuda(monkeypatch):
    """Make the reporter treat FakeCuda as CUDA tensors; return the reads it starts."""
    reads: list[FakeRead] = []

    def device_read(tensors):
        read = FakeRead({key: t.value for key, t in tensors})
        reads.append(read)
        return read

    real = pending.torch_tensor
    monkeypatch.setattr(pending, "torch_tensor", lambda v: isinstance(v, FakeCuda) or real(v))
    monkeypatch.setattr(pending, "DeviceRead", device_read)
    return reads


def test_cuda_values_arrive_later_with_step_numbers_and_times_of_the_call(collector, fake_cuda):
    rep = Reporter(collector.endpoint, "run-1", rank=2)
    try:
        rep.log(epoch=1, loss=FakeCuda(0.25), samples=8, lr=FakeCuda(0.1), tag="a")
        time.sleep(0.02)
        rep.log(epoch=1, loss=1.5, samples=8)  # plain, but after a waiting one: it waits
        rep.log_eval(accuracy=FakeCuda(0.75), loss=FakeCuda(0.5), count=FakeCuda(10))
        rep.flush()
        early = drain(collector, 1, timeout=1.0)
        assert [type(e).__name__ for e in early] == ["Status"]
        assert collector.poll(0.2) == []  # nothing overtook the waiting step
        assert len(fake_cuda) == 2
        for read in fake_cuda:
            read.done = True
        rep.log(epoch=1, loss=0.5, samples=8)  # a later call sends what has arrived
        rep.flush()
        events = drain(collector, 5)
    finally:
        rep.close()
    kinds = [type(e).__name__ for e in early + events]
    assert kinds == ["Status", "Step", "Step", "EpochEnd", "Eval", "Step"]
    assert [e.seq for e in early + events] == list(range(6))
    s1, s2, _, evaluation, s3 = events
    assert (s1.step, s2.step, s3.step) == (1, 2, 3)
    assert (s1.loss, s1.metrics) == (0.25, {"lr": 0.1, "tag": "a"})
    assert s2.loss == 1.5 and s2.step_time >= 0.02  # taken at the call, not at release
    assert s2.samples_per_s == pytest.approx(8 / s2.step_time)
    assert s1.t <= s2.t  # each event keeps the time of its call
    assert (evaluation.accuracy, evaluation.loss, evaluation.count) == (0.75, 0.5, 10)
    assert type(evaluation.count) is int


def test_close_sends_values_that_never_arrived_as_missing(collector, fake_cuda, monkeypatch):
    monkeypatch.setattr(pending, "DRAIN_TIMEOUT_S", 0.05)
    rep = Reporter(collector.endpoint, "run-1", rank=0)
    rep.log(loss=FakeCuda(0.25), samples=4)
    rep.log(loss=2.0, samples=4)
    rep.finished()
    rep.close()
    events = drain(collector, 4)
    assert [type(e).__name__ for e in events] == ["Status", "Step", "Step", "Status"]
    assert [e.loss for e in events[1:3]] == [None, 2.0]
    assert events[-1].state == "finished" and events[-1].seq == 3


def test_close_waits_for_values_in_flight(collector, fake_cuda):
    rep = Reporter(collector.endpoint, "run-1", rank=0)
    rep.log(loss=FakeCuda(0.125), samples=4)
    fake_cuda[0]._polls = fake_cuda[0].queries + 3  # completes a few polls later
    rep.close()
    events = drain(collector, 2)
    assert [(type(e).__name__, getattr(e, "loss", None)) for e in events] == [
        ("Status", None),
        ("Step", 0.125),
    ]


def test_too_many_waiting_steps_drop_the_oldest_and_show_as_gaps(collector, fake_cuda):
    rep = Reporter(collector.endpoint, "run-1", rank=0)
    rep._pending = pending.PendingQueue(capacity=3)
    try:
        for i in range(5):
            rep.log(loss=FakeCuda(float(i)), samples=1)
        assert rep.dropped == 2
        for read in fake_cuda:
            read.done = True
        rep.flush()
        events = drain(collector, 4)
    finally:
        rep.close()
    steps = [e for e in events if type(e).__name__ == "Step"]
    assert [(e.step, e.loss) for e in steps] == [(3, 2.0), (4, 3.0), (5, 4.0)]
    state = RunState("run-1", 1)
    for e in events:
        state.apply(e, now=0.0)
    assert state.ranks[0].gaps == 2


# -- CPU tensors and numpy scalars: read at once ---------------------------------------------
def test_cpu_tensors_are_recorded_as_the_same_floats_with_the_same_step_counts(collector):
    torch = pytest.importorskip("torch")
    np = pytest.importorskip("numpy")
    losses = [torch.tensor(0.1), torch.tensor(2.5, dtype=torch.bfloat16), torch.tensor([0.3])]
    loss_with_grad = (torch.ones(3, requires_grad=True) * 0.7).sum()
    rep = Reporter(collector.endpoint, "run-1", rank=0)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a loss that requires grad is read without a warning
            for loss in [*losses, loss_with_grad]:
                rep.log(epoch=1, loss=loss, samples=2, acc=torch.tensor(3), lr=np.float32(0.1))
            rep.log(epoch=1, loss=np.float64(0.4), samples=2)
            rep.log_eval(
                accuracy=torch.tensor(0.75), loss=np.float32(0.2), count=torch.tensor(10), top5=0.9
            )
        rep.finished()
        events = drain(collector, 9)
    finally:
        rep.close()
    steps = [e for e in events if type(e).__name__ == "Step"]
    expected = [float(t.detach()) for t in [*losses, loss_with_grad]] + [0.4]
    assert [e.loss for e in steps] == expected
    assert [e.step for e in steps] == [1, 2, 3, 4, 5]
    assert steps[0].metrics == {"acc": 3, "lr": float(np.float32(0.1))}
    assert type(steps[0].metrics["acc"]) is int
    (end,) = [e for e in events if type(e).__name__ == "EpochEnd"]
    assert end.samples == 10
    (evaluation,) = [e for e in events if type(e).__name__ == "Eval"]
    assert (evaluation.accuracy, evaluation.count, evaluation.metrics) == (0.75, 10, {"top5": 0.9})
    assert evaluation.loss == float(np.float32(0.2))
    assert [e.seq for e in events] == list(range(len(events)))


def test_a_tensor_of_many_values_is_refused_with_a_clear_error(collector):
    torch = pytest.importorskip("torch")
    rep = Reporter(collector.endpoint, "run-1", rank=0)
    try:
        with pytest.raises(ValueError, match=r"loss must be a number or a one-element tensor"):
            rep.log(loss=torch.ones(3), samples=1)
        with pytest.raises(ValueError, match=r"grad_norm must be .* shape \(2, 2\)"):
            rep.log(loss=1.0, grad_norm=torch.ones(2, 2))
    finally:
        rep.close()


def test_plain_floats_never_import_torch_or_numpy():
    with tempfile.TemporaryDirectory() as tmp:
        code = (
            "import sys, ddptui; ddptui.log(epoch=1, loss=1.0, samples=2, lr=0.1); "
            "ddptui.log_eval(accuracy=0.5, count=3); ddptui.finished(); "
            "print(sorted(m for m in ('torch', 'numpy', 'textual') if m in sys.modules))"
        )
        env = {
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
            "DDPTUI_ENDPOINT": f"ipc://{tmp}/nobody.sock",  # the reporter is live: it sends
            "DDPTUI_RUN_ID": "run-1",
        }
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
        )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stderr


# -- a dead listener -------------------------------------------------------------------------
def dead_endpoint() -> str:
    with zmq.Context() as ctx, ctx.socket(zmq.PULL) as probe:
        port = probe.bind_to_random_port("tcp://127.0.0.1")
    return f"tcp://127.0.0.1:{port}"


def test_nobody_listening_closes_without_linger_and_makes_few_events(monkeypatch):
    made = []
    real_send = Reporter._send

    def counting_send(self, cls, *args, **kwargs):
        made.append(cls)
        return real_send(self, cls, *args, **kwargs)

    monkeypatch.setattr(Reporter, "_send", counting_send)
    rep = Reporter(dead_endpoint(), "run", rank=0)
    real_socket = rep._socket
    lingers = []

    class Spy:
        def __getattr__(self, name):
            return getattr(real_socket, name)

        def close(self, linger=None):
            lingers.append(linger)
            real_socket.close(linger=linger)

    rep._socket = Spy()
    n = 20_000
    for _ in range(n):
        rep.log(loss=1.0, samples=1)
    rep.close()
    assert lingers == [0]  # nothing was queued to a peer that never came: nothing to wait for
    assert (rep.sent, rep.dropped) == (0, n + 1)
    # Once the hold is full, steps are dropped unmade (one a look, every 50 ms at most).
    assert made.count(protocol.Step) < HOLD_EVENTS + 1_000


def test_events_made_before_a_late_listener_are_held_and_delivered_in_order():
    with tempfile.TemporaryDirectory() as tmp, zmq.Context() as ctx:
        endpoint = f"ipc://{tmp}/late.sock"
        rep = Reporter(endpoint, "run-1", rank=0)
        try:
            assert not rep._connected
            rep.started(device="cpu", epochs=2)
            rep.log(epoch=1, loss=1.0, samples=4)
            rep.log_eval(accuracy=0.5)
            with ctx.socket(zmq.PULL) as pull:
                pull.bind(endpoint)
                got: list = []
                deadline = time.monotonic() + 20
                while len(got) < 4 and time.monotonic() < deadline:
                    rep.flush()  # ZeroMQ reconnects on its own; a later call sends the hold
                    if pull.poll(50):
                        got += protocol.decode_batch(pull.recv())
        finally:
            rep.close()
    assert [type(e).__name__ for e in got] == ["Status", "Step", "EpochEnd", "Eval"]
    assert [e.seq for e in got] == [0, 1, 2, 3]
    assert rep.dropped == 0


# -- on a GPU --------------------------------------------------------------------------------
@pytest.mark.gpu
def test_a_cuda_loss_is_logged_without_waiting_and_arrives_with_its_value(collector):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    device = torch.device("cuda", 0)
    x = torch.randn(512, 512, device=device)
    loss = (x @ x).square().mean()
    expected = loss.item()
    # made before the sleep: a host number copied to the device waits for the GPU
    scale = torch.tensor(3.0, device=device)
    rep = Reporter(collector.endpoint, "run-1", rank=0)
    try:
        # warm up with the timed call's own values: as many (pinned host allocations: a new
        # one synchronises with the device, a cached one does not; event creation), made by
        # the same kernels (CUDA loads a kernel's module on its first launch, and the load
        # waits for the device: on an H200 the first `* 2` alone waited 505 ms)
        rep.log(epoch=1, loss=loss.detach() * 2, samples=1, scale=scale)
        rep.flush()
        torch.cuda.synchronize()
        torch.cuda._sleep(1_000_000_000)  # ~0.5 s of GPU time queued ahead of the copy
        rep.log(epoch=1, loss=loss.detach() * 2, samples=1, scale=scale)
        assert len(rep._pending) == 1  # the call returned while the GPU was still busy
        rep.log_eval(
            accuracy=torch.tensor(0.5, device=device), count=torch.tensor(7, device=device)
        )
        rep.finished()
    finally:
        rep.close()  # waits for the device
    events = drain(collector, 6)
    kinds = [type(e).__name__ for e in events]
    assert kinds == ["Status", "Step", "Step", "EpochEnd", "Eval", "Status"]
    s1, s2 = events[1], events[2]
    assert s1.loss == pytest.approx(2 * expected, rel=1e-6)
    assert s2.loss == pytest.approx(2 * expected, rel=1e-6) and s2.metrics == {"scale": 3.0}
    assert (events[4].accuracy, events[4].count) == (0.5, 7)
    assert [e.seq for e in events] == list(range(6))


# -- one reporter per process ----------------------------------------------------------------
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_makes_its_own_reporter(monkeypatch):
    from ddptui.rank import reporter

    monkeypatch.delenv("DDPTUI_ENDPOINT", raising=False)
    reporter.reset_reporter()
    try:
        parent = reporter.get_reporter()
        assert reporter.get_reporter() is parent
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report whether it got a reporter of its own, then leave
            try:
                os.write(write_fd, b"own" if reporter.get_reporter() is not parent else b"same")
            finally:
                os._exit(0)
        os.close(write_fd)
        os.waitpid(pid, 0)
        answer = os.read(read_fd, 16)
        os.close(read_fd)
        assert answer == b"own"
        assert reporter.get_reporter() is parent
    finally:
        reporter.reset_reporter()


@pytest.mark.gpu
def test_device_timing_on_a_gpu():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    x = torch.randn(2048, 2048, device="cuda")
    q = pending.PendingQueue()
    timing = pending.DeviceTiming("matmul_s").start()
    x @ x
    q.push("phase", timing.stop())
    ((item, values),) = q.drain(timeout=10)
    assert item == "phase" and values[0][0] == "matmul_s"
    assert 0 < values[0][1] < 10 and q.failed == 0


def test_a_metric_nothing_can_carry_costs_no_other_event(collector):
    """A 2 MB text, an integer beyond 64 bits, 100 extra metrics: each made the message it
    travelled in invalid, and the steps batched with it were lost. Each is made fit now (cut,
    a float, the first 64), and an event that still cannot go is dropped alone."""
    rep = Reporter(collector.endpoint, "run-1", rank=0)
    try:
        for i in range(12):
            extra = {}
            if i == 3:
                extra = {"note": "x" * 2_000_000, "k" * 10_000: 1}
            elif i == 5:
                extra = {"big": 10**30, "huge": 10**400, "neg": -(10**20)}
            elif i == 7:
                extra = {f"m{j}": j for j in range(100)}
            rep.log(loss=1.0 / (i + 1), samples=4, **extra)
        rep.finished()
        events = drain(collector, 14)
    finally:
        rep.close()
    steps = [e for e in events if type(e).__name__ == "Step"]
    assert [e.step for e in steps] == list(range(1, 13))
    assert collector.stats.rejected == 0 and rep.dropped == 0
    assert steps[3].metrics == {"note": "x" * 256, "k" * 64: 1}
    assert steps[5].metrics == {"big": 1e30, "huge": None, "neg": -1e20}
    assert list(steps[7].metrics) == [f"m{j}" for j in range(protocol.MAX_METRICS)]


def test_numbers_of_numpys_and_other_subclasses_go_as_plain_numbers(collector):
    """open_clip's evaluation metrics are numpy ``float64`` (a float subclass): msgpack refuses
    one, and the evaluation they were the extras of was dropped ("2 dropped", no evaluation)."""
    import enum

    import numpy as np

    class Level(enum.IntEnum):
        HIGH = 3

    rep = Reporter(collector.endpoint, "run-1", rank=0)
    try:
        rep.log_eval(
            epoch=1,
            loss=np.float64(1.3867),
            mean_rank=np.float64(6.5),
            r_at_1=np.float32(0.25),
            n=np.int64(12),
            level=Level.HIGH,
            flag=np.bool_(True),
        )
        rep.log(loss=0.5, samples=4, rank_mean=np.float64(2.5))
        rep.finished()
        events = drain(collector, 4)
    finally:
        rep.close()
    assert rep.dropped == 0 and collector.stats.rejected == 0
    (evaluation,) = [e for e in events if type(e).__name__ == "Eval"]
    assert evaluation.loss == 1.3867
    assert evaluation.metrics == {
        "mean_rank": 6.5,
        "r_at_1": 0.25,
        "n": 12,
        "level": 3,
        "flag": True,
    }
    assert all(type(v) in (float, int, bool) for v in evaluation.metrics.values())
    (step,) = [e for e in events if type(e).__name__ == "Step"]
    assert step.metrics == {"rank_mean": 2.5} and type(step.metrics["rank_mean"]) is float


def test_an_event_that_cannot_be_sent_is_dropped_alone(collector, monkeypatch):
    import ddptui.rank.reporter as reporter_module

    real = protocol.encode_batch

    def encode(events):  # one event nothing can encode (a value msgpack refuses)
        if any(getattr(e, "step", None) == 3 for e in events):
            raise OverflowError("can't serialize ints > 2**64 - 1")
        return real(events)

    monkeypatch.setattr(reporter_module.protocol, "encode_batch", encode)
    rep = Reporter(collector.endpoint, "run-1", rank=0)
    try:
        with rep._lock:  # all in one batch, as the sender thread makes them
            for i in range(6):
                rep._steps.append((time.time(), i + 1, None, 1.0, 4, None, None, {}, None, 1))
            rep._make_steps()
            rep._flush(time.monotonic())
        events = drain(collector, 5)
    finally:
        monkeypatch.setattr(reporter_module.protocol, "encode_batch", real)
        rep.close()
    assert [e.step for e in events if type(e).__name__ == "Step"] == [1, 2, 4, 5, 6]
    assert rep.dropped == 1


def test_values_no_event_can_carry_are_left_out_and_the_step_kept(collector, capsys, monkeypatch):
    """``ddptui.log(epoch="1")`` (or a fractional epoch, a negative count, an integer beyond 64
    bits) made an event the collector refuses, and the steps batched with it went too: a run
    "finished without a step". Each value is made what the event carries, or left out with a
    line on stderr, once per name."""
    np = pytest.importorskip("numpy")
    import ddptui.rank.reporter as reporter_module

    monkeypatch.setattr(reporter_module, "_said", set())
    calls = [
        ({"epoch": "1"}, None),
        ({"epoch": 1.5}, 1),  # a fractional epoch: the one it is in
        ({"epoch": np.int64(2)}, 2),
        ({"epoch": -1}, None),
        ({"epoch": 10**30}, None),
        ({"epoch": True}, None),
        ({"samples": "x"}, None),
        ({"samples": -5}, None),
        ({"samples": 2.7}, None),
        ({"step": "s"}, None),
        ({"loss": "abc"}, None),
        ({"loss": 10**400}, None),
        ({"step_time": -1.0}, None),
        ({"samples_per_s": float("nan")}, None),
        ({"step_time": "slow"}, None),
    ]
    rep = Reporter(collector.endpoint, "run-1", rank=0)
    try:
        for fields, _ in calls:
            rep.log(**{"loss": 0.5, "samples": 4, **fields})
        rep.log_eval(epoch="x", accuracy=0.5, count=-5)
        rep.log_eval(epoch=3, accuracy=0.5, count=np.int32(7))
        rep.finished()
        # Until the last: its started and finished Status, the steps, two epoch ends and the
        # evaluations (a count of them cut it short once, before the second evaluation).
        events = drain(collector, "finished")
    finally:
        rep.close()
    assert collector.stats.rejected == 0 and rep.dropped == 0
    steps = [e for e in events if type(e).__name__ == "Step"]
    assert len(steps) == len(calls)
    assert [s.epoch for s in steps[1:3]] == [1, 2]
    assert [s.samples for s in steps[6:9]] == [0, 0, 2]
    assert [s.step for s in steps] == list(range(1, len(calls) + 1))
    assert [s.loss for s in steps[10:12]] == [None, None]
    # left out, they are measured as when not given: the time since the last step, the rate
    assert steps[12].step_time >= 0.0 and steps[14].step_time >= 0.0
    assert math.isfinite(steps[13].samples_per_s)
    evals = [e for e in events if type(e).__name__ == "Eval"]
    assert [(e.epoch, e.count) for e in evals][-1] == (3, 7)
    assert evals[0].count is None
    err = capsys.readouterr().err.splitlines()
    assert (
        "ddptui: epoch='1' is not a whole number of 0 or more: sent without it (said once)" in err
    )
    assert sorted(line.split("=")[0] for line in err) == [
        "ddptui: count",
        "ddptui: epoch",
        "ddptui: loss",
        "ddptui: samples",
        "ddptui: samples_per_s",
        "ddptui: step",
        "ddptui: step_time",
    ]


def test_an_announcement_with_values_no_event_carries_still_names_the_rank(collector, monkeypatch):
    """``ddptui.started(device=torch.device("cuda", 0), epochs="3")``: the status that names
    the rank's pid (what its stacks are taken by) was refused whole."""
    import ddptui.rank.reporter as reporter_module

    monkeypatch.setattr(reporter_module, "_said", set())

    class Device:  # as a torch.device prints
        def __str__(self):
            return "cuda:0"

    rep = Reporter(collector.endpoint, "run-1", rank=0)
    try:
        rep.started(device=Device(), device_uuid="u" * 1000, epochs="3", steps_per_epoch=-2)
        rep.started(epochs=4)  # something new: announced again, the earlier values kept
        rep.finished()
        events = drain(collector, 3)
    finally:
        rep.close()
    started = [e for e in events if type(e).__name__ == "Status" and e.state == "started"]
    assert [(e.pid, e.device, len(e.device_uuid), e.epochs) for e in started] == [
        (os.getpid(), "cuda:0", 128, None),
        (os.getpid(), "cuda:0", 128, 4),
    ]
    assert all(e.steps_per_epoch is None for e in started)
    assert collector.stats.rejected == 0


def test_a_failure_given_as_an_exception_is_sent_as_its_text(collector):
    rep = Reporter(collector.endpoint, "run-1", rank=0)
    try:
        rep.finished(error=RuntimeError("x" * 5000), traceback=["not", "text"])
        events = drain(collector, 2)
    finally:
        rep.close()
    (failed,) = [e for e in events if type(e).__name__ == "Status" and e.state == "failed"]
    assert failed.error == "x" * 2000 and failed.traceback == "['not', 'text']"


def test_a_step_whose_time_is_no_measure_of_its_rate_goes_without_one(collector):
    """The hooks' first step is timed from its first forward (no step ended before it): its
    batch's wait is not in its time, and its samples over that time were no rate (a
    data-bound script's first step read 8,000 samples/s against 105 after). It goes with
    its time and phases, without a rate; the next steps have theirs."""
    rep = Reporter(collector.endpoint, "run-1", rank=0)
    try:
        now, wall = time.monotonic(), time.time()
        phases = {"forward": 0.001, "backward": 0.002, "optimizer": 0.001}
        rep.log_step_at(
            now, wall, epoch=0, samples=32, step_time=0.004, phases=phases, loss=1.0, rated=False
        )
        rep.log_step_at(
            now + 0.3, wall + 0.3, epoch=0, samples=32, step_time=0.3, phases=None, loss=0.9
        )
        rep.flush()
        steps = [e for e in drain(collector, 3) if type(e) is protocol.Step]
    finally:
        rep.close()
    assert [(s.step, s.step_time, s.samples) for s in steps] == [(1, 0.004, 32), (2, 0.3, 32)]
    assert steps[0].samples_per_s is None and steps[0].phases == phases
    assert steps[1].samples_per_s == pytest.approx(32 / 0.3)
