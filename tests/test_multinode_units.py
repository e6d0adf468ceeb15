"""Multi-node pieces without real ranks: options, Slurm layouts, the join token, the join
service's refusals, and the CURVE inbox refusing peers without the run's keys."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import threading
import time
import zlib

import pytest
import zmq

from ddptui import protocol
from ddptui.join import agent as agent_module
from ddptui.join.channel import Channel
from ddptui.join.command import config_from_node0, token_text
from ddptui.run.cluster.host import NodeHost
from ddptui.run.cluster.slurm import sbatch_script, slurm_layout, srun_argv, tasks_per_node
from ddptui.run.cluster.token import JoinToken, RunKeys, TokenError
from ddptui.run.config import build_config
from ddptui.run.launcher import LaunchResult
from ddptui.run.machine import Machine
from ddptui.run.options import ConfigError, RunConfig
from ddptui.run.state import RankFailureInfo
from ddptui.runfiles import write_private
from tests.helpers import ROOT, wait_until

pytestmark = pytest.mark.waits  # mostly waits on timers: run beside real runs (tests/conftest.py)

CPU = Machine(0, "no GPU here", cpu_count=2)
ALLOC = {
    "SLURM_JOB_ID": "7",
    "SLURM_JOB_NUM_NODES": "1",
    "SLURM_TASKS_PER_NODE": "2",
    "SLURM_NTASKS": "2",
    "SLURM_JOB_NODELIST": "localhost",
}


def build(tmp_path, **raw):
    raw.setdefault("device", "cpu")
    raw.setdefault("run_dir", str(tmp_path / "run"))
    return build_config(raw, CPU, deep=False)


def refused(tmp_path, **raw) -> str:
    with pytest.raises(ConfigError) as info:
        build(tmp_path, **raw)
    return str(info.value)


# -- options --------------------------------------------------------------------------------------
def test_single_node_config_is_unchanged(tmp_path):
    cfg = build(tmp_path, world_size=2)
    assert (cfg.nnodes, cfg.world_size, cfg.rdzv_endpoint, cfg.bind) == (1, 2, None, None)
    assert not cfg.multinode and cfg.launcher == "spawn"


def test_nnodes_times_nproc_is_the_world_size(tmp_path):
    cfg = build(tmp_path, nnodes=3, nproc_per_node=2, rdzv_endpoint="127.0.0.1:29999")
    assert (cfg.nnodes, cfg.nproc_per_node, cfg.world_size) == (3, 2, 6)
    assert cfg.launcher == "torchrun" and cfg.multinode
    assert cfg.rdzv_endpoint == "127.0.0.1:29999" and cfg.bind == "127.0.0.1"


def test_world_size_that_disagrees_is_refused(tmp_path):
    message = refused(
        tmp_path, nnodes=2, nproc_per_node=2, world_size=3, rdzv_endpoint="127.0.0.1:1"
    )
    assert "--world-size 3 disagrees with --nnodes 2 x --nproc-per-node 2 = 4" in message
    build(tmp_path, nnodes=2, nproc_per_node=2, world_size=4, rdzv_endpoint="127.0.0.1:1")


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"nnodes": 2, "launcher": "spawn"}, "torchrun's c10d rendezvous"),
        ({"rdzv_endpoint": "127.0.0.1:5"}, "--rdzv-endpoint is for multi-node runs"),
        ({"bind": "127.0.0.1"}, "--bind is for multi-node runs"),
        ({"nnodes": 2, "rdzv_endpoint": "127.0.0.1"}, "HOST:PORT"),
        ({"nnodes": 2, "rdzv_endpoint": "127.0.0.1:99999"}, "port from 1 to 65535"),
        ({"nnodes": 2, "rdzv_endpoint": "a b:1"}, "HOST:PORT"),
        ({"nnodes": 2, "rdzv_endpoint": "127.0.0.1:5", "bind": "192.0.2.7"}, "not an address"),
        ({"nnodes": 2, "rdzv_endpoint": "127.0.0.1:5", "bind": "0.0.0.0\x00"}, "--bind"),
        ({"nnodes": 0}, "--nnodes must be at least 1"),
        ({"nnodes": "1e400"}, "--nnodes must be a whole number"),
        ({"nnodes": 2, "nproc_per_node": 9, "rdzv_endpoint": "127.0.0.1:5"}, "--nproc-per-node"),
    ],
)
def test_bad_multinode_options_are_refused(tmp_path, raw, expected):
    assert expected in refused(tmp_path, **raw)


def test_cli_refuses_with_exit_2_before_anything_starts(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "ddptui.cli", "--no-ui", "--device", "cpu", "--nnodes", "2"]
        + ["--nproc-per-node", "1", "--world-size", "3", "--run-dir", str(tmp_path / "r")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "disagrees" in proc.stderr and not (tmp_path / "r").exists()


# -- Slurm -------------------------------------------------------------------------------------
def test_tasks_per_node_expands_slurm_compressed_form():
    assert tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert tasks_per_node("4") == [4]
    for bad in ("", "x", "2(x)", "2(x999999999)"):
        with pytest.raises(ValueError):
            tasks_per_node(bad)


def test_slurm_layout_from_the_allocation():
    assert slurm_layout(ALLOC, None, None) == (1, 2)
    assert slurm_layout(ALLOC, None, 1) == (1, 1)
    four = {**ALLOC, "SLURM_JOB_NUM_NODES": "4", "SLURM_TASKS_PER_NODE": "8(x4)"}
    assert slurm_layout(four, 4, None) == (4, 8)


@pytest.mark.parametrize(
    ("env", "nnodes", "nproc", "names"),
    [
        ({}, None, None, ["SLURM_JOB_ID", "SLURM_JOB_NUM_NODES"]),
        (ALLOC, None, 3, ["--nproc-per-node 3", "SLURM_TASKS_PER_NODE=2"]),
        (
            {**ALLOC, "SLURM_JOB_NUM_NODES": "2", "SLURM_TASKS_PER_NODE": "2,1"},
            None,
            None,
            ["disagree", "SLURM_TASKS_PER_NODE=2,1"],
        ),
        (ALLOC, 2, None, ["--nnodes 2", "SLURM_JOB_NUM_NODES=1"]),
        ({**ALLOC, "SLURM_TASKS_PER_NODE": "2(x2)"}, None, None, ["SLURM_JOB_NUM_NODES=1"]),
        ({**ALLOC, "SLURM_STEP_NUM_TASKS": "1"}, None, None, ["srun step"]),
    ],
)
def test_slurm_layout_that_cannot_work_names_the_variables(env, nnodes, nproc, names):
    with pytest.raises(ConfigError) as info:
        slurm_layout(env, nnodes, nproc)
    for name in names:
        assert name in str(info.value)


def test_slurm_config_and_srun_start_one_agent_per_node(tmp_path):
    cfg = build(tmp_path, launcher="slurm", environ=ALLOC)
    assert (cfg.launcher, cfg.nnodes, cfg.world_size, cfg.multinode) == ("slurm", 1, 2, True)
    assert cfg.rdzv_endpoint.startswith("localhost:")
    argv = srun_argv(4, "/r/nodes")
    assert "--ntasks=4" in argv and "--ntasks-per-node=1" in argv
    assert argv[-5:] == ["join", "--slurm", "--run-dir", "/r/nodes"][-5:] or "join" in argv
    assert not any(a.startswith("ddp1.") for a in argv)  # the token travels in the env


def test_print_sbatch_writes_a_script(tmp_path):
    text = sbatch_script(["--launcher", "slurm", "--epochs", "1"], 2, 4)
    assert text.startswith("#!/bin/bash\n") and "#SBATCH --nodes=2" in text
    assert "#SBATCH --ntasks-per-node=4" in text and "--launcher slurm --epochs 1" in text
    proc = subprocess.run(
        [sys.executable, "-m", "ddptui.cli", "--launcher", "slurm", "--print-sbatch"]
        + ["--nnodes", "2", "--epochs", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --nodes=2" in proc.stdout and "--launcher slurm" in proc.stdout
    assert "--print-sbatch" not in proc.stdout


# -- the token ---------------------------------------------------------------------------------
def test_token_round_trip_carries_no_server_secret():
    keys = RunKeys.generate()
    token = JoinToken("10.0.0.1:4000", keys.server_public, keys.client_secret)
    text = token.encode()
    assert JoinToken.decode(text) == token
    assert keys.server_secret.decode() not in text and keys.server_secret.decode() not in repr(keys)
    assert token.client_public == keys.client_public


@pytest.mark.parametrize(
    "text", ["", "hello", "ddp1.", "ddp1.!!!", "ddp1." + "A" * 2000, "ddp1.eyJlIjoxfQ"]
)
def test_damaged_tokens_are_one_line_errors(text):
    with pytest.raises(TokenError):
        JoinToken.decode(text)


# -- node 0's join service and inbox ------------------------------------------------------------
def two_node_config(**fields) -> RunConfig:
    """Node 0's configuration of a run of 4 ranks on 2 nodes, with ``fields``."""
    return RunConfig(
        run_id="run-x",
        world_size=4,
        nnodes=2,
        rdzv_endpoint="127.0.0.1:29999",
        launcher="torchrun",
        **fields,
    )


@pytest.fixture
def host(tmp_path):
    node_host = NodeHost(two_node_config(bind="127.0.0.1", run_dir=str(tmp_path)))
    yield node_host
    node_host.close(linger=0)


def join(token: JoinToken, node=None, timeout=5.0):
    channel = Channel(token)
    try:
        return channel.ask({"op": "join", "v": 1, "node": node, "host": "h"}, timeout)
    finally:
        channel.close()


def test_closing_leaves_the_join_service_socket_to_its_thread_while_it_answers(
    tmp_path, monkeypatch
):
    """On a loaded machine the service thread may still be answering a request when the run
    closes: its socket is not closed from the main thread under it (ZeroMQ sockets are used
    by one thread only), nor the context terminated (which would wait for that socket); the
    close returns, and the thread ends once its answer is sent."""

    from ddptui.run.cluster import host as host_module

    node_host = NodeHost(two_node_config(bind="127.0.0.1", run_dir=str(tmp_path)))
    answering, release = threading.Event(), threading.Event()
    real = node_host._answer

    def slow(request):
        answering.set()
        release.wait(10)
        return real(request)

    monkeypatch.setattr(node_host, "_answer", slow)
    monkeypatch.setattr(host_module, "SERVE_STOP_S", 0.3)
    thread = node_host._thread
    asker = threading.Thread(target=join, args=(node_host.token(),), kwargs={"timeout": 10})
    asker.start()
    try:
        assert answering.wait(10)
        started = time.monotonic()
        node_host.close(linger=0)
        assert time.monotonic() - started < 5
        assert node_host._service is not None and not node_host._service.closed
        assert not node_host.context.closed
    finally:
        release.set()
        asker.join(15)
        thread.join(15)
    assert not thread.is_alive()  # it answered, saw the stop, and ended
    node_host._service.close(linger=0)
    node_host.context.term()
    # and an idle one closes everything
    idle = NodeHost(two_node_config(bind="127.0.0.1", run_dir=str(tmp_path / "b")))
    idle.close(linger=0)
    assert idle._service is None and idle.context.closed


def test_join_gives_config_then_refuses_twice_and_late(host, tmp_path):
    reply = join(host.token())
    assert reply["ok"] and reply["node"] == 1 and reply["telemetry"].startswith("tcp://")
    cfg = config_from_node0(reply["config"], str(tmp_path / "n1"))
    assert (cfg.run_id, cfg.nnodes, cfg.world_size) == ("run-x", 2, 4)
    assert cfg.run_dir == str(tmp_path / "n1")
    twice = join(host.token(), node=1)
    assert not twice["ok"] and "joined already" in twice["error"]
    late = join(host.token())
    assert not late["ok"] and "too late" in late["error"]
    host.set_outcome("failed", "rank 1 failed")
    ended = join(host.token(), node=1)
    assert not ended["ok"] and "has ended" in ended["error"]


def test_a_joined_node_sends_its_ranks_traces_when_node_0_asks(host, tmp_path):
    """Node 0 asks (every status answer carries the request); the node's agent sends each of
    its ranks' traces, compressed, over the CURVE channel; node 0 checks and writes them
    where its analysis reads every rank's. A trace that is not one is refused."""
    trace = (ROOT / "tests" / "data" / "fr" / "hang" / "fr-rank-1.json").read_bytes()
    assert join(host.token())["ok"]  # node 1
    channel = Channel(host.token())
    try:
        assert channel.ask({"op": "status", "v": 1, "node": 1}, 5)["traces"] == 0
        fetched: dict = {}
        asking = threading.Thread(target=lambda: fetched.update(host.fetch_traces([1], 10)))
        asking.start()
        ask = wait_until(
            lambda: channel.ask({"op": "status", "v": 1, "node": 1}, 5)["traces"] or None, 5
        )
        request = {"op": "trace", "v": 1, "node": 1, "ask": ask, "rank": 1}
        bad = channel.ask({**request, "trace": zlib.compress(b'{"rank": 1}')}, 5)
        assert not bad["ok"] and "malformed entries" in bad["error"]
        assert channel.ask({**request, "trace": zlib.compress(trace)}, 5) == {"ok": True}
        asking.join(10)
    finally:
        channel.close()
    assert fetched == {1: "ok"}
    written = json.loads((tmp_path / "fr-rank-1.json").read_text())
    assert written == json.loads(trace)
    assert host.fetch_traces([1], 0.2) == {1: "no trace from its node in 0.2 s"}  # a new ask


def test_close_waits_for_an_agent_still_polling_and_not_for_one_that_ended(host, monkeypatch):
    """Once the run has an outcome, node 0 waits (up to its linger) until every agent still
    polling has been told it; an agent whose node ended on its own has stopped polling and is
    not waited for (every finished multi-node run waited the whole linger for it)."""
    monkeypatch.setattr("ddptui.run.cluster.host.AGENT_GONE_S", 1.0)
    assert join(host.token())["ok"]  # node 1: it polls once, then its node ends
    channel = Channel(host.token())
    try:
        assert channel.ask({"op": "status", "v": 1, "node": 1}, 5)["outcome"] is None
        host.set_outcome("finished", None)
        polled = threading.Timer(0.3, lambda: channel.ask({"op": "status", "v": 1, "node": 1}, 5))
        polled.start()  # still polling: told at its next poll, and close waits for that
        began = time.monotonic()
        host.close(linger=10.0)
        waited = time.monotonic() - began
        polled.join()
    finally:
        channel.close()
    assert 0.2 <= waited < 1.0 and host.book.told == {1}


def test_close_does_not_wait_for_an_agent_that_stopped_polling(host, monkeypatch):
    monkeypatch.setattr("ddptui.run.cluster.host.AGENT_GONE_S", 0.5)
    assert join(host.token())["ok"]
    host.set_outcome("finished", None)
    began = time.monotonic()
    host.close(linger=10.0)
    assert time.monotonic() - began < 0.8 and host.book.told == set()


def test_wrong_token_gets_no_answer_and_the_run_is_not_disturbed(host):
    other = RunKeys.generate()
    wrong = dataclasses.replace(host.token(), client_secret=other.client_secret)
    assert join(wrong, timeout=1.0) is None
    assert host.book.joined == {}
    assert join(host.token())["ok"]


def test_join_command_with_a_wrong_token_exits_2_in_one_line(host):
    other = RunKeys.generate()
    wrong = dataclasses.replace(host.token(), client_secret=other.client_secret).encode()
    proc = subprocess.run(
        [sys.executable, "-m", "ddptui.cli", "join", wrong, "--timeout", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "did not answer" in proc.stderr and host.book.joined == {}


def test_node_0_counts_the_nodes_still_to_join(host):
    """The dashboard shows the join lines while this is not 0 (then they give the table and
    charts their room back)."""
    from ddptui.run.session import RunSession

    session = RunSession(host.cfg)  # not started: only its view of the join book
    session.host = host
    assert session.nodes_to_join == 1 and session.join_line.startswith("ddptui join ddp1.")
    assert host.book.join(None, "other-host")[0] == 1
    assert session.nodes_to_join == 0
    session.host = None  # the fixture closes it


def test_join_takes_the_token_or_node_0s_run_directory_that_holds_it(tmp_path, host):
    """``ddptui join RUN_DIR`` (a shared file system) reads node 0's ``join-token`` file; the
    token itself passes through; a directory without one, a FIFO, a file too large or a word
    that is neither is one line (TokenError), never a hang or a traceback."""
    token = host.token().encode()
    assert token_text(token) == token
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_private(run_dir / "join-token", token + "\n")
    assert (run_dir / "join-token").stat().st_mode & 0o077 == 0  # the owner's only
    for given in (run_dir, run_dir / "join-token"):
        assert JoinToken.decode(token_text(str(given))) == host.token()
    (run_dir / "join-token").chmod(0o644)  # others may read it: refused, as ssh refuses a key
    with pytest.raises(TokenError, match="must be yours and private"):
        token_text(str(run_dir))
    (run_dir / "join-token").chmod(0o600)
    if os.getuid() == 0:  # root can give it away: someone else's private file is refused too
        os.chown(run_dir / "join-token", 4242, -1)
        with pytest.raises(TokenError, match="owner uid 4242"):
            token_text(str(run_dir))
    (run_dir / "join-token").unlink()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "big").write_text("x" * 100_000)
    for given, why in (
        (run_dir, "no join token there (the run has ended"),
        (tmp_path / "nowhere", "not a ddptui join token"),
        ("ddp2.abc", "not a ddptui join token"),
        (fifo, "cannot read"),
        (tmp_path / "big", "cannot read"),
    ):
        with pytest.raises(TokenError, match=re.escape(why)) as info:
            text = token_text(str(given))
            JoinToken.decode(text)
        assert "\n" not in str(info.value)


def _event(run="run-x", rank=0):
    return protocol.Step(run=run, rank=rank, t=time.time(), seq=0, step=1, loss=0.5, samples=8)


def _push(endpoint: str, keys: tuple[bytes, bytes, bytes] | None) -> None:
    context = zmq.Context()
    sock = context.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 500)
    if keys is not None:
        server_public, client_public, client_secret = keys
        sock.curve_serverkey = server_public
        sock.curve_publickey = client_public
        sock.curve_secretkey = client_secret
    sock.connect(endpoint)
    for _ in range(5):
        sock.send(protocol.encode_batch([_event()]))
    sock.close()
    context.term()


def _received(host, seconds=1.5):
    events, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        events += host.inbox.poll(0.1)
    return events


def test_forged_events_never_reach_the_collector(host):
    endpoint = host.telemetry_endpoint
    _push(endpoint, None)  # plain TCP, no CURVE at all
    stranger = RunKeys.generate()
    _push(endpoint, (host.keys.server_public, stranger.client_public, stranger.client_secret))
    assert _received(host) == []
    token = host.token()
    _push(endpoint, (token.server_public, token.client_public, token.client_secret))
    assert len(_received(host)) == 5  # the run's own key is let in: the test can fail


# -- node samples -------------------------------------------------------------------------------
def test_node_sample_from_a_real_monitor_snapshot_is_valid_and_kept_by_node():
    from ddptui.join.agent import node_sample
    from ddptui.monitor import SystemMonitor
    from ddptui.run.state import RunState

    with SystemMonitor(pcie=False) as monitor:
        sample = node_sample(monitor.sample(), "run-x", 3, "hostname", seq=0)
    assert protocol.implausible(sample) is None
    (back,) = protocol.decode_batch(protocol.encode_batch([sample]))
    assert back == sample and protocol.from_json(protocol.to_json(sample)) == sample
    state = RunState("run-x", 2)
    state.apply(sample)
    assert state.node_samples[3].host == "hostname" and state.events_applied == 0
    assert all(view.events == 0 for view in state.ranks.values())


@pytest.mark.parametrize(
    "changes",
    [
        {"cpu_percent": float("nan")},
        {"cpu_percent": 1e400},
        {"load1": -1.0},
        {"gpus": [protocol.GpuSample(index=0, util=float("inf"))]},
        {"gpus": [protocol.GpuSample(index=0, power=-5.0)]},
    ],
)
def test_implausible_node_samples_are_rejected(changes):
    sample = protocol.NodeSample(run="r", rank=0, t=1.0, seq=0, node=1, **changes)
    assert protocol.implausible(sample) is not None


def test_node_sample_schema_bounds_what_a_node_may_send():
    too_many = [{"index": i} for i in range(protocol.MAX_NODE_GPUS + 1)]
    raw = {"kind": "node", "v": 1, "run": "r", "rank": 0, "t": 1.0, "seq": 0, "node": 1}
    import msgspec

    with pytest.raises(protocol.InvalidEvent):
        protocol.decode_batch(msgspec.msgpack.encode([{**raw, "gpus": too_many}]))
    with pytest.raises(protocol.InvalidEvent):
        protocol.decode_batch(msgspec.msgpack.encode([{**raw, "host": "h" * 500}]))


# -- node 0's verdict -----------------------------------------------------------------------------
class _FakeHost:
    def __init__(self):
        self.outcome = None

    def set_outcome(self, outcome, failure):
        self.outcome = (outcome, failure)

    def close(self, linger=0):
        pass


@pytest.mark.parametrize(
    ("local", "named"),
    [
        (RankFailureInfo(rank=0, signal="SIGKILL"), "rank 0 was killed by signal SIGKILL"),
        (RankFailureInfo(rank=0, exit_code=1, error="gloo: Connection reset"), "rank 1 failed"),
    ],
)
def test_a_failure_on_any_node_ends_the_run_failed_naming_the_first_cause(tmp_path, local, named):
    """Node 0 stops its own ranks when another node reports a failure: the run is failed,
    not stopped; a rank killed here is named, a rank that only lost its peer is not."""
    from ddptui.run.launcher import LaunchResult
    from ddptui.run.session import RunSession

    cfg = build(tmp_path, nnodes=2, nproc_per_node=1, rdzv_endpoint="127.0.0.1:5")
    session = RunSession(cfg)
    session.host = _FakeHost()
    session.state.apply(
        protocol.Status(run=cfg.run_id, rank=0, t=1.0, seq=0, state="started", host="h0", node=0)
    )
    session.remote_failure = RankFailureInfo(rank=1, error="node 1 (host h1): killed")
    session._conclude(LaunchResult(1, failure=local, stopped=True), drain=False)
    assert session.state.outcome == "failed" and session.exit_code == 1
    assert named in session.state.failure.describe()
    assert session.host.outcome[0] == "failed"


def test_only_the_ranks_on_this_host_are_sampled():
    from ddptui import protocol
    from ddptui.run.session import local_pids
    from ddptui.run.state import RunState

    state = RunState("r", 3)
    for rank, host in ((0, "here"), (1, "node-b"), (2, None)):
        status = protocol.Status(run="r", rank=rank, t=0.0, seq=0, state="started", pid=50 + rank)
        state.apply(status, now=0.0)
        state.ranks[rank].host = host
    assert local_pids(state, "here") == {0: 50, 2: 52}


class _Node0Says:
    """Node 0's channel as the agent reads it: every status answer says ``outcome``."""

    def __init__(self, outcome):
        self.outcome = outcome

    def answer(self, give_up_after=None):
        return {"ok": True, "outcome": self.outcome, "failure": None, "traces": 0}

    def ask_later(self, request):
        pass

    def send(self, events):
        return 0


class _Torchrun:
    """A node's launcher that exits 0 by itself after ``polls`` polls (None: never)."""

    def __init__(self, polls):
        self.polls, self.left, self.stopped = polls, polls, False

    def poll(self):
        if self.left is None:
            return None
        self.left -= 1
        return LaunchResult(0) if self.left < 0 else None

    def stop(self, grace=None):
        self.stopped = True
        return LaunchResult(-15, stopped=True)


class _NoEvents:
    def poll(self, timeout):
        time.sleep(min(timeout, 0.01))
        return []


@pytest.mark.parametrize(
    ("outcome", "polls", "stopped", "code", "said"),
    [
        ("finished", 3, False, 0, "node 1 finished"),  # torchrun exits by itself
        ("finished", None, True, 0, "node 1 finished"),  # not within the grace: stopped
        ("failed", 3, True, 1, "the run ended failed"),  # no grace for a failed run
    ],
)
def test_a_node_told_the_run_finished_lets_its_torchrun_exit_and_finishes(
    monkeypatch, tmp_path, outcome, polls, stopped, code, said
):
    """Node 0 says the run finished once every rank did; this node's torchrun is then on
    its way out (past its exit barrier). It gets a grace to exit by itself, and a node that
    had to stop it after the run finished still finished. Stopped at once, this node said
    "FAILED: node 1 (host vm): the launcher exited with code -15" and exited 1, as `.ci/run`
    saw once on a loaded machine, in a run that had finished."""
    monkeypatch.setattr(agent_module, "FINISHED_GRACE_S", 0.3)
    cfg = RunConfig(launcher="torchrun", world_size=4, nnodes=2, run_dir=str(tmp_path))
    node = agent_module.NodeAgent(cfg, 1, _Node0Says(outcome), "", "vm")
    monkeypatch.setattr(node, "_send_sample", lambda: None)
    torchrun = _Torchrun(polls)
    result = node._follow(torchrun, _NoEvents())
    assert torchrun.stopped is stopped
    lines = []
    assert node._conclude(result, lines.append) == code
    assert lines[-1].startswith(said)


def test_a_joining_node_finds_the_runs_module_itself(tmp_path, monkeypatch):
    """``--module``: node 0 sends the module's name; each node finds its file as python -m
    there would (its own checkout, its own PYTHONPATH), and a name that is no string or no
    module there is one line, not a traceback."""
    node0 = two_node_config(script="/node0/checkout/mypkg/train.py", script_module="mypkg.train")
    sent = json.loads(json.dumps(dataclasses.asdict(node0)))  # as the join service sends it
    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text("pass\n")
    monkeypatch.chdir(tmp_path)
    cfg = config_from_node0(sent, str(tmp_path / "n1"))
    assert (cfg.script_module, cfg.script) == ("mypkg.train", str(package / "train.py"))
    with pytest.raises(ConfigError, match="no module 'mypkg.gone'"):
        config_from_node0({**sent, "script_module": "mypkg.gone"}, str(tmp_path / "n1"))
    with pytest.raises(ConfigError, match="malformed 'script_module'"):
        config_from_node0({**sent, "script_module": ["mypkg"]}, str(tmp_path / "n1"))


def test_a_joining_node_passes_its_ranks_the_local_rank_flag_node_0_sent(tmp_path):
    """``--local-rank-arg`` goes into every node's ranks' environment: what node 0 sent is
    checked as the option is (a flag, a string), one line when it is not."""
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    node0 = two_node_config(script=str(script), local_rank_arg="--local_rank")
    sent = json.loads(json.dumps(dataclasses.asdict(node0)))
    cfg = config_from_node0(sent, str(tmp_path / "n1"))
    assert cfg.rank_environment()["DDPTUI_LOCAL_RANK_ARG"] == "--local_rank"
    for bad in (7, ["--local_rank"], "--local_rank=0; rm"):
        with pytest.raises(ConfigError, match="--local-rank-arg must name an option"):
            config_from_node0({**sent, "local_rank_arg": bad}, str(tmp_path / "n1"))
