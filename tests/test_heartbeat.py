"""The rank's heartbeat: where the main thread is, a digest that changes when its stack moves,
and CPU time that counts the rank's DataLoader workers (a rank waiting for busy workers is not
idle)."""

import shlex
import subprocess
import sys
import threading
import time

import pytest

from ddptui.rank import heartbeat


def test_the_main_frame_and_digest_follow_the_main_thread():
    seen = []
    done = threading.Event()

    def sample():
        seen.append(heartbeat.main_frames())
        done.set()

    threading.Thread(target=sample).start()
    done.wait(5)
    frames = seen[0]
    funcs = [f.func for f in frames]  # innermost first: threading's wait, then this test
    assert funcs[0] == "wait" and "test_the_main_frame_and_digest_follow_the_main_thread" in funcs
    assert heartbeat.digest(frames) == heartbeat.digest(list(frames))
    assert heartbeat.digest(frames) != heartbeat.digest(frames[1:])


def test_a_deep_stack_keeps_its_outermost_frames():
    """Importing timm goes 274 frames deep: a beat that kept the innermost 200 had lost the
    script's line, and a rank read ``import torchvision`` where its script imported timm."""
    ready, done = threading.Event(), threading.Event()

    def nested(depth):
        if depth:
            return nested(depth - 1)
        ready.set()
        done.wait(10)

    def script_line():
        nested(300)

    thread = threading.Thread(target=script_line)
    thread.start()
    try:
        assert ready.wait(10)
        frames = heartbeat.main_frames(thread.ident)
    finally:
        done.set()
        thread.join(10)
    funcs = [f.func for f in frames]
    assert len(frames) == heartbeat.MAX_FRAMES
    assert funcs[0] == "wait"  # the innermost...
    assert funcs[-1] == "_bootstrap" and "script_line" in funcs[-heartbeat.OUTER_FRAMES :]
    assert 0 < funcs.count("nested") < 301  # the middle of the recursion left out


def test_a_beat_samples_the_thread_that_trains(monkeypatch):
    """Steps that come from another thread than the main one (a loop in a thread the main
    thread joins, an RPC thread): the beat's frame is that thread's, while it lives; the
    main thread's before it steps and after it ends."""
    sent = []

    class Reporter:
        def beat(self, **values):
            sent.append(values)

    go, stop = threading.Event(), threading.Event()

    def train_loop():
        go.set()
        stop.wait(10)

    trainer = threading.Thread(target=train_loop)
    monkeypatch.setattr(heartbeat, "_thread_source", None)
    beat = heartbeat.Heartbeat(Reporter())
    beat.beat()  # no source: the main thread (this test)
    trainer.start()
    go.wait(5)
    try:
        heartbeat.set_thread_source(lambda: trainer.ident)
        beat.beat()
    finally:
        stop.set()
        trainer.join(5)
    beat.beat()  # the thread ended: the main thread again
    frames = [values["frame"] for values in sent]
    assert frames[0].startswith("test_a_beat_samples_the_thread_that_trains (")
    assert frames[1].startswith("train_loop (test_heartbeat.py:")
    assert frames[2].startswith("test_a_beat_samples_the_thread_that_trains (")
    heartbeat.set_thread_source(lambda: threading.main_thread().ident)
    assert heartbeat.steps_thread() is None  # the main thread trains: nothing to name


@pytest.mark.parametrize("shell", [False, True])
def test_cpu_counts_busy_children(shell):
    """A DataLoader worker, or an evaluation run through a shell (``os.system``: the busy
    process is the shell's child, the rank's grandchild)."""
    busy = [sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 3: pass"]
    if shell:  # "; true": the shell forks the command instead of becoming it
        busy = ["/bin/sh", "-c", f"{shlex.join(busy)}; true"]
    child = subprocess.Popen(busy)
    try:
        deadline = time.monotonic() + 10
        while heartbeat._children_cpu(heartbeat.os.getpid()) < 0.3:
            assert time.monotonic() < deadline, "the child's CPU was never counted"
            time.sleep(0.1)
        assert heartbeat.process_cpu() >= time.process_time() + 0.25
    finally:
        child.kill()
        child.wait()


def test_io_counts_files_and_pipes_not_plain_sockets(tmp_path):
    import os
    import socket

    import pytest

    before = heartbeat.process_io()
    if before is None:
        pytest.skip("the kernel counts no storage I/O per process here (/proc/self/io)")
    with open(tmp_path / "checkpoint.bin", "wb") as out:
        out.write(os.urandom(4 << 20))
        out.flush()
    written = heartbeat.process_io()
    assert written - before >= 4 << 20
    a, b = socket.socketpair()
    with a, b:
        for _ in range(16):  # 1 MiB through the socket, 64 KiB at a time (its buffer holds it)
            a.sendall(b"x" * (64 << 10))
            got = 0
            while got < 64 << 10:
                got += len(b.recv(64 << 10))
    assert heartbeat.process_io() - written < 64 * 1024  # sockets (telemetry, gloo) do not
    # A checkpoint streamed to an uploader through a pipe (``aws s3 cp -``): its writes count
    # (and the reader's reads, here the same process).
    before = heartbeat.process_io()
    r, w = os.pipe()
    try:
        for _ in range(16):
            os.write(w, b"x" * (64 << 10))
            got = 0
            while got < 64 << 10:
                got += len(os.read(r, 64 << 10))
    finally:
        os.close(r)
        os.close(w)
    assert heartbeat.process_io() - before >= (2 << 20) - 4096  # less its /proc reading


def test_io_counts_a_child_and_never_goes_back(tmp_path):
    """An uploader the rank runs (``aws s3 cp``) moves the checkpoint, not the rank: its I/O
    counts while it runs, and stays counted once it has ended (a total that went back would
    read as the rank having moved)."""
    import subprocess

    import pytest

    before = heartbeat.process_io()
    if before is None:
        pytest.skip("the kernel counts no I/O per process here (/proc/self/io)")
    target = tmp_path / "upload.bin"
    code = (
        "import os, sys, time\n"
        "with open(sys.argv[1], 'wb') as f:\n"
        "    f.write(os.urandom(2 << 20))\n"
        "print('written', flush=True)\n"
        "time.sleep(60)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code, str(target)], stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline() == b"written\n"
        during = heartbeat.process_io()
        assert during - before >= 2 << 20
    finally:
        child.kill()
        child.wait()
    assert heartbeat.process_io() >= during  # it ended: what it moved stays
    idle = heartbeat.process_io()
    time.sleep(0.2)
    assert heartbeat.process_io() - idle < 4096  # its own reading of /proc is not I/O


def _tcp_pair():
    """Both ends of a loopback TCP connection, in this process."""
    import socket

    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
    return client, accepted


def test_socket_bytes_counts_a_tcp_connection_and_keeps_a_closed_ones_bytes():
    """A plain socket's traffic (an HTTP download without TLS) is no ``/proc/<pid>/io``
    I/O; the kernel's TCP counters say it moved. A connection closed keeps what it moved
    (a total that went back would read as the rank having moved)."""
    client, accepted = _tcp_pair()
    before = heartbeat.socket_bytes()
    with client, accepted:
        for _ in range(16):  # 1 MiB, 64 KiB at a time: sent (acknowledged) and received
            client.sendall(b"x" * (64 << 10))
            got = 0
            while got < 64 << 10:
                got += len(accepted.recv(64 << 10))
        moved = heartbeat.socket_bytes()
        if moved == before:
            pytest.skip("the kernel gives no TCP byte counters here (TCP_INFO)")
        assert moved - before >= 2 << 20
    assert heartbeat.socket_bytes() >= moved
    import os

    fds = len(os.listdir("/proc/self/fd"))
    for _ in range(50):  # it reads duplicates of the descriptors, and closes every one
        heartbeat.socket_bytes()
    assert len(os.listdir("/proc/self/fd")) == fds


def test_a_beat_counts_tcp_traffic_only_between_beats_of_an_unmoved_stack(monkeypatch):
    """Read only where it is asked whether a rank standing still works (a download by rank
    0 while its peers wait at a barrier): between two beats that found the stack where it
    was. A training rank's connections (its collectives) move while its stack moves, and
    never count."""
    from ddptui.rank.frames import Frame

    stacks = {"a": [Frame("train.py", 7, "<module>")], "b": [Frame("train.py", 9, "<module>")]}
    where = ["a"]
    traffic = [0]
    monkeypatch.setattr(heartbeat, "main_frames", lambda ident=None: stacks[where[0]])
    monkeypatch.setattr(heartbeat, "process_io", lambda children=None: 1000)
    monkeypatch.setattr(heartbeat, "socket_bytes", lambda: traffic[0])
    monkeypatch.setattr(heartbeat, "_collectives", None)
    reporter = _Beats()
    beat = heartbeat.Heartbeat(reporter, interval=3600)  # not started: beats only when asked
    for stack, moved in [("a", 0), ("a", 500), ("a", 70_000), ("b", 9_000), ("b", 300)]:
        where[0] = stack
        traffic[0] += moved
        beat.beat()
    # a, then a again (the baseline), +70,000 while it stood there; b moved (its 9,000 not
    # counted), b again (a new baseline)
    assert [b["io"] for b in reporter.beats] == [1000, 1000, 71_000, 71_000, 71_000]


class _Beats:
    enabled = True

    def __init__(self):
        self.beats = []

    def beat(self, **fields):
        self.beats.append(fields)


def test_the_last_beat_at_exit_carries_the_collectives_as_they_ended(monkeypatch):
    """Beats come once a second; at exit one more carries the collectives' final marks, so a
    healthy run's ranks do not end showing the counts of beats a second apart."""
    seq = [146]
    monkeypatch.setattr(
        heartbeat, "_collectives", lambda: [{"pg": "default_pg", "started": seq[0]}]
    )
    reporter = _Beats()
    beat = heartbeat.Heartbeat(reporter, interval=3600)  # not started: beats only when asked
    beat.beat()
    seq[0] = 184
    beat.last()
    assert [b["collectives"][0]["started"] for b in reporter.beats] == [146, 184]
    assert all(b["io"] is None or b["io"] >= 0 for b in reporter.beats)
    assert reporter.beats[-1]["frame"] is None and reporter.beats[-1]["digest"] is None
    beat.last()  # already stopped: nothing more
    assert len(reporter.beats) == 2


def test_no_last_beat_from_a_heartbeat_stopped_before_the_exit(monkeypatch):
    monkeypatch.setattr(heartbeat, "_collectives", None)
    reporter = _Beats()
    beat = heartbeat.Heartbeat(reporter, interval=3600)
    beat.stop()  # a spawner goes quiet once its workers run
    beat.last()
    assert reporter.beats == []


def test_a_failing_collectives_source_never_fails_the_last_beat(monkeypatch):
    def broken():
        raise RuntimeError("recorder gone")

    monkeypatch.setattr(heartbeat, "_collectives", broken)
    reporter = _Beats()
    heartbeat.Heartbeat(reporter, interval=3600).last()
    assert reporter.beats[0]["collectives"] == []


def test_a_beat_says_when_the_rank_holds_no_ddp_module_and_the_run_state_keeps_it(monkeypatch):
    """The hooks know whether a DDP module is alive: a beat says False when none is (a
    ``backward()`` in that rank's stack is then its own work, for the hang diagnosis too),
    and nothing when one may be (no hooks to say, or one watched)."""
    from ddptui.run.state import RunState

    monkeypatch.setattr(heartbeat, "_collectives", None)

    holds = [False]

    def twice(beat):
        beat.beat()
        holds[0] = True
        beat.beat()

    heartbeat.set_ddp_source(lambda: holds[0])
    try:
        beats = _beats_sent(twice, 2)
    finally:
        heartbeat.set_ddp_source(None)
    assert [b.ddp for b in beats] == [False, None]
    state = RunState("r", 1)
    state.apply(beats[0])
    assert state.ranks[0].no_ddp is True
    state.apply(beats[1])
    assert state.ranks[0].no_ddp is False


def test_a_beat_carries_the_evaluation_batches_and_a_bad_source_reads_zero(monkeypatch):
    """The hooks' count of evaluation batches goes out with every beat (and the last one at
    exit), over the real wire; a source that fails or says something else than a count
    never fails a beat: 0."""

    monkeypatch.setattr(heartbeat, "_collectives", None)
    counts = iter([7, -3, "9", 2**70])

    def source():
        value = next(counts, None)
        if value is None:
            raise RuntimeError("gone")
        return value

    def four_and_the_last(beat):
        for _ in range(4):
            beat.beat()
        beat.last()  # the source raises now

    heartbeat.set_evaluations_source(source)
    try:
        beats = _beats_sent(four_and_the_last, 5)
    finally:
        heartbeat.set_evaluations_source(None)
    assert [b.evaluations for b in beats] == [7, 0, 0, 0, 0]
    assert heartbeat.evaluations() == 0  # no source: 0


def test_a_beat_carries_how_often_the_sampled_thread_woke(monkeypatch):
    """Over the real wire: the main thread's wakes (its voluntary context switches) grow by
    its sleeps between two beats; once steps come from another thread, that thread's."""
    monkeypatch.setattr(heartbeat, "_collectives", None)
    monkeypatch.setattr(heartbeat, "_thread_source", None)
    go, stop = threading.Event(), threading.Event()

    def loop():
        go.set()
        stop.wait(10)

    trainer = threading.Thread(target=loop)

    def beats(beat):
        beat.beat()
        for _ in range(20):
            time.sleep(0.001)
        beat.beat()
        trainer.start()
        go.wait(5)
        heartbeat.set_thread_source(lambda: trainer.ident)
        beat.beat()

    try:
        first, second, third = _beats_sent(beats, 3)
    finally:
        heartbeat.set_thread_source(None)
        stop.set()
        trainer.join(5)
    assert 20 <= second.wakes - first.wakes <= 40, (first.wakes, second.wakes)
    assert third.frame.startswith("loop (test_heartbeat.py:")
    assert third.wakes is not None and third.wakes < first.wakes  # the new thread's own count
    assert heartbeat.thread_wakes(None) is None
    assert heartbeat.thread_wakes(-1) is None


def _beats_sent(send, count):
    """The beats a :class:`heartbeat.Heartbeat` sends through ``send(heartbeat)``, over the
    real wire (a reporter to a collector), once ``count`` events have arrived."""
    from ddptui import protocol
    from ddptui.rank.reporter import Reporter
    from ddptui.run.collector import Collector
    from tests.helpers import drain

    with Collector("r", world_size=1) as collector:
        rep = Reporter(collector.endpoint, "r", rank=0)
        try:
            send(heartbeat.Heartbeat(rep, interval=3600))
            rep.flush()
            got = drain(collector, lambda events: len(events) >= count)
        finally:
            rep.close()
    return [e for e in got if type(e) is protocol.Beat]
