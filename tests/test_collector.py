"""The collector: a private ipc socket, and nothing a sender does can stop it or fill it."""

import os
import socket
import stat

import msgspec
import psutil
import zmq

from ddptui import protocol
from ddptui.run.collector import MAX_IPC_PATH, Collector
from ddptui.run.state import RunState
from tests.helpers import drain


def push_all(endpoint, messages):
    with zmq.Context() as ctx, ctx.socket(zmq.PUSH) as push:
        push.setsockopt(zmq.LINGER, 5_000)
        push.connect(endpoint)
        for message in messages:
            push.send(message)


def step(rank=0, seq=0, **fields):
    return protocol.Step(run="run-1", rank=rank, t=1.0, seq=seq, step=seq + 1, **fields)


def test_ipc_socket_lives_in_a_private_directory_removed_at_close():
    collector = Collector("run-1", world_size=2)
    try:
        assert collector.endpoint.startswith("ipc://")
        path = collector.endpoint.removeprefix("ipc://")
        assert len(path.encode()) <= MAX_IPC_PATH
        directory = os.path.dirname(path)
        info = os.stat(directory)
        assert stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == os.getuid()
        assert stat.S_ISSOCK(os.stat(path).st_mode)
        push_all(collector.endpoint, [protocol.encode_batch([step()])])
        assert len(drain(collector, lambda e: len(e) == 1)) == 1
    finally:
        collector.close()
    assert not os.path.exists(directory)


def test_a_long_temp_dir_falls_back_to_a_short_one(monkeypatch, tmp_path):
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(deep))
    monkeypatch.setenv("TMPDIR", str(deep))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    with Collector("run-1") as collector:
        assert len(collector.endpoint.removeprefix("ipc://").encode()) <= MAX_IPC_PATH


def test_hostile_messages_are_counted_and_dropped_and_the_run_goes_on():
    hostile = [
        b"\x91\x81\xa4kind\xa3\xff\xfe\xfd",  # invalid UTF-8: once killed ddptui
        b"\xd9\x03\xff\xff\xff",
        b"\x91" * 100_000 + b"\xc0",
        msgspec.msgpack.encode("not a batch"),
        b"\x00" * (protocol.MAX_MESSAGE_BYTES + 1),
        protocol.encode_batch([step(rank=10**9), step(rank=2)]),
        protocol.encode_batch([step(step_time=-1.0), step(samples_per_s=float("nan"))]),
        protocol.encode_batch([protocol.Step(run="other", rank=0, t=1.0, seq=0, step=1)]),
    ]
    good = protocol.encode_batch([step(rank=1, loss=float("nan"))])
    with Collector("run-1", world_size=2) as collector:
        push_all(collector.endpoint, [*hostile, good])
        events = drain(collector, lambda e: len(e) == 1)
        stats = collector.stats
        assert len(events) == 1 and events[0].rank == 1
        assert (stats.malformed, stats.oversized, stats.implausible, stats.foreign) == (4, 1, 4, 1)
        assert stats.rejected == 10 and stats.received == 1


def test_one_event_the_schema_refuses_costs_only_itself():
    """A script's ``ddptui.log(epoch="1")`` made one invalid event, and the collector refused
    the whole message: every step batched with it was lost (a run "finished without a
    step")."""
    events = [msgspec.to_builtins(step(seq=i)) for i in range(4)]
    events[1]["epoch"] = "1"
    events[2]["loss"] = {"not": "a number"}
    with Collector("run-1", world_size=2) as collector:
        push_all(collector.endpoint, [msgspec.msgpack.encode(events)])
        got = drain(collector, lambda e: len(e) == 2)
        assert [e.seq for e in got] == [0, 3]
        assert collector.stats.malformed == 2 and collector.stats.received == 2


def test_two_hundred_thousand_bogus_ranks_cost_no_memory():
    n = 200_000
    per_message = protocol.MAX_BATCH_EVENTS
    messages = [
        protocol.encode_batch([step(rank=2 + i) for i in range(start, min(n, start + per_message))])
        for start in range(0, n, per_message)
    ]
    me = psutil.Process()
    with Collector("run-1", world_size=2) as collector:
        state = RunState("run-1", 2)
        rss_before = me.memory_info().rss
        push_all(collector.endpoint, messages)
        events = drain(collector, lambda _: collector.stats.implausible >= n)
        for event in events:
            state.apply(event, now=0.0)
        grew = me.memory_info().rss - rss_before
    assert events == [] and collector.stats.implausible == n
    assert sorted(state.ranks) == [0, 1]
    # Once 3.3 KB per bogus rank (660 MB here); the messages themselves are ~10 MB.
    assert grew < 50 * 2**20, grew


def test_socket_directories_of_killed_collectors_are_removed_at_the_next_start(tmp_path):
    from ddptui.run import collector as module

    base = tmp_path / "base"
    base.mkdir()
    killed = base / "ddptui-killed01"
    killed.mkdir(mode=0o700)
    with socket.socket(socket.AF_UNIX) as gone:  # a socket file nobody listens on any more
        gone.bind(str(killed / "c"))
    empty = base / "ddptui-empty001"  # killed between creating the directory and binding
    empty.mkdir(mode=0o700)
    full = base / "ddptui-notours1"  # holds something else: not a collector's
    full.mkdir(mode=0o700)
    (full / "c").write_bytes(b"")
    fresh = base / "ddptui-fresh001"  # maybe a collector between mkdtemp and bind
    fresh.mkdir(mode=0o700)
    other = base / "not-ddptui"
    other.mkdir()
    link = base / "ddptui-link0001"
    link.symlink_to(other)
    for path in (killed, empty, full, other):
        os.utime(path, (0, 0))
    module.remove_stale_ipc_dirs(str(base))
    assert not killed.exists() and not empty.exists()
    assert fresh.exists() and full.exists() and other.exists() and link.is_symlink()


def test_a_directory_with_a_live_listener_is_kept(tmp_path):
    from ddptui.run import collector as module

    base = tmp_path / "base"
    base.mkdir()
    live = base / "ddptui-alive001"
    live.mkdir(mode=0o700)
    with zmq.Context() as ctx, ctx.socket(zmq.PULL) as pull:
        pull.bind(f"ipc://{live / 'c'}")
        os.utime(live, (0, 0))
        module.remove_stale_ipc_dirs(str(base))
        assert live.exists()
    os.utime(live, (0, 0))
    module.remove_stale_ipc_dirs(str(base))  # its listener has gone
    assert not live.exists()
