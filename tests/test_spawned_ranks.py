"""A script that spawns its own ranks (torch.multiprocessing.spawn, one process per GPU):
the run grows to the world its workers' process group declares, within bounds, and the
spawner goes quiet."""

import json
import os
import subprocess
import sys

import msgspec
import pytest

from ddptui import protocol
from ddptui.rank.reporter import Reporter
from ddptui.run.collector import Collector
from ddptui.run.diagnosis import CAUSES, Diagnoser, spawner_hint
from ddptui.run.state import RunState
from tests.helpers import drain, processes_of_run, read_events, step_numbers


def started(rank, world_size, state="started", run="r"):
    return protocol.Status(
        run=run, rank=rank, t=0.0, seq=0, state=state, pid=100 + rank, world_size=world_size
    )


@pytest.mark.parametrize(
    "event, world, grown",
    [
        (started(1, 2), 1, 2),  # the second worker of two, in a run launched as one process
        (started(3, 4), 1, 4),
        (started(1, 2), 2, None),  # nothing to grow
        (started(4, 4), 1, None),  # its rank is outside the world it declares
        (started(1, protocol.MAX_GROWN_WORLD + 1), 1, None),  # beyond the bound
        (started(1, 2, state="finished"), 1, None),  # only an announcement grows the run
        (protocol.Step(run="r", rank=1, t=0.0, seq=1, step=1), 1, None),
    ],
)
def test_grown_world(event, world, grown):
    assert protocol.grown_world(event, world) == grown


def test_run_state_grows_to_the_spawned_world_and_keeps_the_first_rank():
    state = RunState("r", 1)
    state.apply(started(0, 1), now=0.0)
    state.apply(protocol.Step(run="r", rank=1, t=0.0, seq=1, step=1), now=0.5)
    assert state.world_size == 1 and state.events_ignored == 1  # not announced: ignored
    state.apply(started(1, 2), now=1.0)
    assert state.world_size == 2 and sorted(state.ranks) == [0, 1]
    assert state.ranks[1].state == "started" and state.ranks[1].pid == 101
    state.apply(protocol.Step(run="r", rank=1, t=0.0, seq=2, step=1), now=2.0)
    assert state.ranks[1].step == 1


def test_collector_accepts_a_grown_world_and_still_refuses_ranks_beyond_it():
    with Collector("r", world_size=1) as collector:
        rep = Reporter(collector.endpoint, "r", rank=1)
        try:
            rep._send(protocol.Step, step=1)  # before any announcement: refused
            rep._send(protocol.Status, state="started", pid=5, world_size=2)
            rep._send(protocol.Step, step=2)
            rep.rank = 7
            rep._send(protocol.Step, step=3)  # outside the grown world
            rep.flush()
            got = drain(collector, lambda got: collector.stats.implausible >= 2 and len(got) >= 2)
        finally:
            rep.close()
    assert [(type(e).__name__, e.rank) for e in got] == [("Status", 1), ("Step", 1)]
    assert collector.world_size == 2 and collector.stats.implausible == 2


def test_a_muted_reporter_sends_nothing_more():
    with Collector("r", world_size=1) as collector:
        rep = Reporter(collector.endpoint, "r", rank=0)
        try:
            rep.started(device="cpu")
            rep.mute()
            rep.log(loss=1.0, samples=1)
            rep.finished(error="ProcessRaisedException: a worker failed")
            rep.flush()
            got = []
            for _ in range(20):
                got += collector.poll(0.05)
        finally:
            rep.close()
    assert [(type(e).__name__, getattr(e, "state", None)) for e in got] == [("Status", "started")]


def test_beats_repeat_the_last_sequence_number_so_leaving_them_out_is_no_gap():
    with Collector("r", world_size=1) as collector:
        rep = Reporter(collector.endpoint, "r", rank=0)
        try:
            rep._send(protocol.Step, step=1)
            rep.beat("main (x.py:1)", None, "d", 1.0)
            rep._send(protocol.Step, step=2)
            rep.flush()
            got = drain(collector, lambda got: len(got) >= 3)
        finally:
            rep.close()
    assert [(type(e).__name__, e.seq) for e in got] == [("Step", 0), ("Beat", 0), ("Step", 1)]
    replayed = RunState("r", 1)
    for event in got:
        if type(event) is not protocol.Beat:  # events.jsonl keeps few beats
            replayed.apply(event, now=1.0)
    assert replayed.dropped == 0


class FakeDist:
    """``torch.distributed`` as a worker sees it once its group exists."""

    def __init__(self, initialized, rank=1, world_size=2):
        self.initialized, self.rank, self.world_size = initialized, rank, world_size

    def is_available(self):
        return True

    def is_initialized(self):
        return self.initialized

    def get_rank(self):
        return self.rank

    def get_world_size(self):
        return self.world_size


def test_a_worker_whose_group_was_made_unseen_learns_its_rank_from_the_group(monkeypatch):
    """``from torch.distributed import init_process_group`` at a script's top: the worker's
    group is made by torch's own function, and the rank is read from the group instead."""
    from ddptui.rank import spawned

    seen = []
    monkeypatch.setattr(spawned, "_group_seen", False)
    monkeypatch.setattr(spawned, "on_process_group", lambda r, w: seen.append((r, w)))
    monkeypatch.delenv(spawned.SPAWNED_ENV, raising=False)
    assert spawned.learn_rank() is True and seen == []  # no spawned worker: nothing to learn
    monkeypatch.setenv(spawned.SPAWNED_ENV, "1")
    monkeypatch.setitem(sys.modules, "torch.distributed", FakeDist(initialized=False))
    assert spawned.learn_rank() is False and seen == []  # no group yet: asked again later
    monkeypatch.setitem(sys.modules, "torch.distributed", FakeDist(initialized=True))
    assert spawned.learn_rank() is True and seen == [(1, 2)]
    broken = FakeDist(initialized=True)
    broken.get_rank = lambda: 1 / 0
    monkeypatch.setitem(sys.modules, "torch.distributed", broken)
    assert spawned.learn_rank() is False  # never raises into the script


@pytest.mark.parametrize("group", [False, True])
def test_a_worker_that_forms_no_process_group_ends_unheard(monkeypatch, group):
    """torch RPC's master and parameter server in pytorch/examples' ``ddp_rpc``: mp.spawn's
    workers 2 and 3 that join only the RPC world, never a rank. At their exit each announced
    itself as rank 0 (the rank it inherited): its local rank refused as outside the world,
    its ``finished`` taken as rank 0's. A worker that formed its group ends as a rank does."""
    from ddptui.rank import reporter as reporter_module
    from ddptui.rank import spawned

    monkeypatch.setattr(spawned, "_group_seen", group)
    monkeypatch.setenv(spawned.SPAWNED_ENV, "1")
    monkeypatch.delenv(spawned.AGENT_STORE_ENV, raising=False)
    monkeypatch.setitem(sys.modules, "torch.distributed", FakeDist(initialized=False))
    monkeypatch.setattr(reporter_module, "_unheard_at_exit", None, raising=False)
    spawned._become_worker()  # what such a worker does first
    with Collector("r", world_size=2) as collector:
        rep = Reporter(collector.endpoint, "r", rank=1 if group else 0)
        monkeypatch.setattr(reporter_module, "_reporter", rep)
        try:
            reporter_module._at_exit(rep)
            got = []
            for _ in range(20):
                got += collector.poll(0.05)
        finally:
            rep.close()
    assert [e.state for e in got] == (["started", "finished"] if group else [])
    assert collector.stats.rejected == 0


def test_a_seen_group_announces_once(monkeypatch):
    from ddptui.rank import spawned

    monkeypatch.setattr(spawned, "_group_seen", False)
    monkeypatch.setenv(spawned.SPAWNED_ENV, "1")
    monkeypatch.delenv(spawned.ENDPOINT_ENV, raising=False)  # nobody listens: no reporter
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    spawned.on_process_group(3, 4)
    assert spawned.learn_rank() is True  # the wrapper saw it: nothing more to ask
    assert (os.environ["RANK"], os.environ["WORLD_SIZE"]) == ("3", "4")


def test_a_spawned_worker_rendezvous_as_under_python_not_as_torchruns_worker(monkeypatch):
    """A one-process spawner runs under ddptui's torchrun; torchrun's flag that sends its own
    workers to the agent's store must not reach the script's workers (an env:// group of
    theirs would wait 30 minutes for a store nobody serves)."""
    from ddptui.rank import spawned

    monkeypatch.setenv(spawned.AGENT_STORE_ENV, "True")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv(spawned.SPAWNED_ENV, "")
    monkeypatch.delenv(spawned.ENDPOINT_ENV, raising=False)
    monkeypatch.setattr("ddptui.rank.reporter._reporter", None)
    seen = {}

    def worker(index, tag):
        seen.update(index=index, tag=tag, store=os.environ.get(spawned.AGENT_STORE_ENV))
        seen.update(local=os.environ["LOCAL_RANK"], spawned=os.environ[spawned.SPAWNED_ENV])

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29400")
    monkeypatch.delenv(spawned.AGENT_ENDPOINT_ENV, raising=False)
    spawned.spawned_worker(worker, lambda: None, 1, "x")
    assert seen == {"index": 1, "tag": "x", "store": None, "local": "1", "spawned": "1"}
    assert os.environ[spawned.AGENT_ENDPOINT_ENV] == "127.0.0.1:29400"


def test_a_spawned_worker_knows_torchruns_store_though_the_script_set_its_own(monkeypatch):
    """yangkky/distributed_tutorial's ``mnist-distributed.py`` sets ``MASTER_ADDR`` and
    ``MASTER_PORT`` (8888) itself before ``mp.spawn``: its workers inherited the script's
    endpoint, took it for torchrun's, went back to the agent-store flag and waited as clients
    of a store nobody served. The rank notes torchrun's store before its script runs."""
    from ddptui.rank import spawned

    monkeypatch.setattr("ddptui.rank.reporter._reporter", None)
    monkeypatch.setenv(spawned.TORCHRUN_STORE_ENV, "10.0.0.9:1")  # inherited: not this run's
    monkeypatch.delenv(spawned.AGENT_ENDPOINT_ENV, raising=False)
    monkeypatch.setenv(spawned.AGENT_STORE_ENV, "True")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29400")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv(spawned.SPAWNED_ENV, "")  # the worker sets it: put back after
    spawned.note_agent_store()  # the rank entry, before the script
    monkeypatch.setenv("MASTER_PORT", "8888")  # the script, before it spawns
    assert os.environ[spawned.TORCHRUN_STORE_ENV] == "127.0.0.1:29400"
    seen = {}
    spawned.spawned_worker(
        lambda index: (spawned.before_rendezvous(), seen.update(flag=os.environ.get(
            spawned.AGENT_STORE_ENV))),
        lambda: None,
        0,
    )  # fmt: skip
    assert os.environ[spawned.AGENT_ENDPOINT_ENV] == "127.0.0.1:29400"
    assert seen == {"flag": None}  # the script's own endpoint: rank 0 serves its store
    monkeypatch.delenv(spawned.TORCHRUN_STORE_ENV)
    monkeypatch.delenv(spawned.AGENT_STORE_ENV, raising=False)  # no torchrun rank: nothing
    spawned.note_agent_store()
    assert spawned.TORCHRUN_STORE_ENV not in os.environ


@pytest.mark.parametrize(
    ("port", "flag"),
    [
        ("29400", "True"),  # Lightning's ddp_spawn: the agent's own endpoint, its store serves
        ("12355", None),  # multigpu.py's own port: rank 0 serves a store of its own
    ],
)
def test_a_spawned_worker_uses_the_agents_store_only_at_the_agents_endpoint(
    monkeypatch, port, flag
):
    from ddptui.rank import spawned

    monkeypatch.setenv(spawned.AGENT_ENDPOINT_ENV, "127.0.0.1:29400")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", port)
    monkeypatch.setenv(spawned.AGENT_STORE_ENV, "True" if flag is None else "")
    spawned.before_rendezvous()
    assert os.environ.get(spawned.AGENT_STORE_ENV) == flag


def test_no_agent_endpoint_leaves_the_flag_alone(monkeypatch):
    from ddptui.rank import spawned

    monkeypatch.delenv(spawned.AGENT_ENDPOINT_ENV, raising=False)
    monkeypatch.setenv(spawned.AGENT_STORE_ENV, "True")  # torchrun's own worker
    spawned.before_rendezvous()
    assert os.environ[spawned.AGENT_STORE_ENV] == "True"


def run_headless(args, run_dir, env=None):
    """``ddptui --no-ui --world-size 1 --hang-timeout 60 --run-dir run_dir`` with ``args``
    (options, then the script's after ``--``), from the run directory's parent; whatever the
    run started is killed once it returns, however it ends."""
    cmd = [sys.executable, "-m", "ddptui.console", "--no-ui", "--world-size", "1"]
    cmd += ["--hang-timeout", "60", "--run-dir", str(run_dir), *args]
    try:
        return subprocess.run(
            cmd, capture_output=True, text=True, timeout=150, cwd=run_dir.parent, env=env
        )
    finally:
        config = run_dir / "config.json"
        run_id = json.loads(config.read_text())["run_id"] if config.is_file() else None
        for leftover in processes_of_run(run_id) if run_id else []:
            leftover.kill()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_workers_that_meet_at_torchruns_endpoint_train_under_ddptuis_torchrun(tmp_path):
    """The shape of Lightning's ddp_spawn under torchrun: the workers keep torchrun's
    MASTER_ADDR/PORT. Without the agent's store their rank 0 failed to listen there
    ("address already in use"); plain torchrun runs it."""
    from tests.helpers import ROOT

    run_dir = tmp_path / "run"
    script = ROOT / "tests/scripts/spawn_at_agent.py"
    proc = run_headless(["--launcher", "torchrun", "--script", str(script)], run_dir)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    log = (run_dir / "rank-0.log").read_text()
    assert "worker 0 done" in log and "worker 1 done" in log
    assert len(step_numbers(read_events(run_dir))) == 6  # 3 steps x 2 workers


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_workers_that_meet_at_the_scripts_own_endpoint_train_under_ddptuis_torchrun(tmp_path):
    """The script sets MASTER_ADDR/PORT itself before it spawns (yangkky's
    ``mnist-distributed.py``): its workers meet there as under ``python script.py``. They
    waited as clients of a store nobody served, 'spawned 2 workers, waiting for their
    process group', until stopped; the hang timeout (60 s) judges no spawner."""
    from ddptui.rank.net import free_port
    from tests.helpers import ROOT

    run_dir = tmp_path / "run"
    script = ROOT / "tests/scripts/spawn_at_agent.py"
    args = ["--launcher", "torchrun", "--script", str(script), "--", "--own-port", str(free_port())]
    proc = run_headless(args, run_dir)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    log = (run_dir / "rank-0.log").read_text()
    assert "worker 0 done" in log and "worker 1 done" in log
    assert len(step_numbers(read_events(run_dir))) == 6  # 3 steps x 2 workers


SHARING_SCRIPT = """
import os
import sys

import torch
import torch.multiprocessing as mp


def work(index, out):
    with open(os.path.join(out, f"worker-{index}"), "w") as f:
        f.write(f"{torch.get_num_threads()} {os.environ.get('OMP_NUM_THREADS')}")


if __name__ == "__main__":
    mp.start_processes(work, args=(sys.argv[1],), nprocs=2, start_method=sys.argv[2])
"""


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_the_workers_a_rank_spawns_share_its_threads(tmp_path, method):
    """A one-rank run whose script spawns two workers (ignite's ``--nproc_per_node 2``,
    pytorch/examples' ``multigpu.py``): the rank's threads (``DDPTUI_THREADS=4`` here) are
    split between them, 2 each, whether they are spawned (they read ``OMP_NUM_THREADS`` as
    they import torch) or forked (they had the spawner's torch threads). They took 4 each,
    and on two cores ignite's CIFAR-10 example ran 8 times slower than under ``python``."""
    script = tmp_path / "share.py"
    script.write_text(SHARING_SCRIPT)
    run_dir = tmp_path / "run"
    args = ["--launcher", "spawn", "--script", str(script), "--", str(tmp_path), method]
    env = {**os.environ, "DDPTUI_THREADS": "4", "OMP_NUM_THREADS": "4"}
    proc = run_headless(args, run_dir, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for index in (0, 1):
        assert (tmp_path / f"worker-{index}").read_text() == "2 2"


# -- a spawner waiting for its workers' group ----------------------------------------------------
def note_spawned(workers, rank=0, seq=1):
    return protocol.Note(run="r", rank=rank, t=0.0, seq=seq, code="spawned", workers=workers)


def test_a_spawner_is_shown_waiting_for_its_workers_group_and_its_silence_is_no_problem():
    from ddptui.headless import progress_line
    from ddptui.run.state import STARTUP_SILENT_S
    from ddptui.tui.model import where_cell

    state = RunState("r", 1)
    state.apply(started(0, 1), now=0.0)
    state.apply(
        protocol.Beat(run="r", rank=0, t=0.0, seq=0, frame="<module> (__init__.py:20)"), now=0.5
    )
    state.apply(note_spawned(2), now=1.0)
    view = state.ranks[0]
    assert view.spawned == 2 and view.frame is None  # not where it stood before it spawned
    late = 1.0 + 10 * STARTUP_SILENT_S
    assert state.health(late) == {}  # a spawner only waits: its silence is by design
    assert "preparing (rank 0: spawned 2 workers, waiting for their process group)" in (
        progress_line(state, late)
    )
    assert where_cell(view, ended=False) == "spawned 2 workers"
    state.apply(note_spawned(1, seq=2), now=late)  # pytorch/examples' ImageNet on a CPU node
    assert "preparing (rank 0: spawned 1 worker, waiting" in progress_line(state, late)
    assert where_cell(state.ranks[0], ended=False) == "spawned 1 worker"
    assert state.notes == {}  # its own state, no finding
    # its worker of rank 0 announces itself (another process): the row is the worker's now
    worker = protocol.Status(run="r", rank=0, t=0.0, seq=0, state="started", pid=555)
    state.apply(worker, now=2.0)
    assert state.ranks[0].spawned == 0 and state.ranks[0].pid == 555


@pytest.mark.parametrize("workers", [0, -1, 1025, True])
def test_a_spawned_note_out_of_bounds_is_refused(workers):
    raw = {"kind": "note", "v": 1, "run": "r", "rank": 0, "t": 0.0, "seq": 1}
    raw.update(code="spawned", workers=workers)
    with pytest.raises(protocol.InvalidEvent):
        protocol.decode_batch(msgspec.msgpack.encode([raw]))


def test_the_spawner_says_how_many_workers_it_spawned_then_goes_quiet(monkeypatch):
    from ddptui.rank import heartbeat, spawned
    from ddptui.rank import reporter as reporter_module

    class Fake:
        def __init__(self):
            self.calls = []

        def note(self, code, **numbers):
            self.calls.append(("note", code, numbers))

        def mute(self):
            self.calls.append(("mute",))

    fake = Fake()
    monkeypatch.setattr(reporter_module, "get_reporter", lambda: fake)
    monkeypatch.setattr(heartbeat, "stop", lambda: fake.calls.append(("beat stopped",)))
    spawned.became_spawner(2)
    assert fake.calls == [("beat stopped",), ("note", "spawned", {"workers": 2}), ("mute",)]
    fake.calls.clear()
    spawned.became_spawner("2")  # not a count: no note, still quiet
    assert fake.calls == [("beat stopped",), ("mute",)]


@pytest.mark.parametrize(
    ("workers", "threads"), [(3, "2"), (8, "1"), (20, "1"), (0, "8"), (True, "8"), ("2", "8")]
)
def test_a_spawners_threads_are_split_among_its_workers_at_least_one_each(
    monkeypatch, workers, threads
):
    from ddptui.rank import spawned

    monkeypatch.setenv("DDPTUI_THREADS", "8")
    monkeypatch.setenv("OMP_NUM_THREADS", "8")
    spawned.share_threads(workers)  # no count of workers (0, a bool, a string): left alone
    assert os.environ["OMP_NUM_THREADS"] == os.environ["DDPTUI_THREADS"] == threads


# -- a hang among the workers a script started -------------------------------------------------
HANG_SCRIPT = """
import os, sys, time
import torch, torch.distributed as dist, torch.multiprocessing as mp
import torch._dynamo  # DDP's constructor imports it: over 5 s on a loaded machine (see below)
from torch import nn


def work(rank, world, port):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", port
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model = nn.parallel.DistributedDataParallel(nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(200):
        if rank == 1 and step == 5:
            time.sleep(120)  # rank 1 stops before its next forward
        loss = model(torch.randn(8, 16)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(0.05)


if __name__ == "__main__":
    port, how = sys.argv[1], sys.argv[2]
    if how == "spawn":
        mp.spawn(work, args=(2, port), nprocs=2)
    else:
        workers = [mp.Process(target=work, args=(rank, 2, port)) for rank in range(2)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
"""


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize(("how", "launcher"), [("spawn", "spawn"), ("process", "torchrun")])
def test_a_hang_among_a_scripts_workers_is_named_from_their_own_traces(tmp_path, how, launcher):
    """Rank 1 of the workers a script started (mp.spawn; a Process each, forked under
    torchrun) stops before a collective rank 0 waits in. The traces and stacks ddptui asks
    for are the workers' own: it was the spawner that answered for rank 0 ("rank 0 hung
    outside any collective, in <module>", its mp.spawn line), rank 1 had none, and torch's
    analyzer, told a world of one, said "rank 0 never entered all_gather #1 that ranks
    entered in".

    The workers import ``torch._dynamo`` before they meet: in the constructor of their DDP
    module, under the full suite's load, the import outlasted ``--hang-timeout 5`` and the
    run was said hung there (their beats stopped, their CPU idle: not understood; see the
    thirty-sixth session's note). Not seen again in the thirty-seventh, whose full-suite run
    ran this test three times each way without the import (all passed); since then a silent
    rank whose I/O moves, by ddptui's own sample, is not stuck."""
    from ddptui.rank.net import free_port

    script = tmp_path / "hang.py"
    script.write_text(HANG_SCRIPT)
    run_dir = tmp_path / "run"
    args = ["--launcher", launcher, "--hang-timeout", "5", "--script", str(script), "--"]
    proc = run_headless([*args, str(free_port()), how], run_dir)
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    details = [d["detail"] for d in summary["diagnoses"]]
    named = [d for d in details if "never entered all_reduce" in d]
    assert named and named[-1].startswith("rank 1 never entered all_reduce #"), details
    assert "that rank 0 waits in" in named[-1], details
    assert not [d for d in details if "<module>" in d], details  # no spawner's stack
    for rank in (0, 1):
        assert (run_dir / f"fr-rank-{rank}.json").is_file()
        stacks = (run_dir / f"stacks-rank-{rank}.txt").read_text()
        assert "in work" in stacks and "start_processes" not in stacks, stacks[-2000:]


def _spawners(*launched):
    """A run's state where each of ``launched`` ((node, rank, workers)) said it spawned."""
    state = RunState("r", 4)
    for seq, (node, rank, workers) in enumerate(launched):
        started = protocol.Status(run="r", rank=rank, t=0.0, seq=0, state="started", node=node)
        state.apply(started, now=1.0)
        note = protocol.Note(
            run="r", rank=rank, t=0.0, seq=1 + seq, code="spawned", workers=workers
        )
        state.apply(note, now=2.0)
    return state


def test_a_node_whose_launched_processes_each_spawned_workers_is_told_once():
    """yangkky's ``mnist-distributed.py`` at ddptui's default of 2 ranks: both launched copies
    started their 2 workers, the second's failed to listen on the script's port, and the run
    failed naming rank 0's lost peer; nothing said why. Now a note says so (no verdict); one
    spawner a node (a multi-node run of such a script) is the script's way, and says nothing."""
    diagnoser = Diagnoser()
    state = _spawners((None, 0, 2), (None, 1, 2))
    found = diagnoser.notes(state)
    assert [(d.rank, d.cause) for d in found] == [(0, "spawners")]
    assert found[0].detail.startswith("ranks 0, 1 spawned workers of their own (2 each): ")
    assert "launch it as one process a node (--world-size 1" in found[0].detail
    assert diagnoser.notes(state) == []  # once
    assert "spawners" in CAUSES
    for apart in [((None, 0, 2),), ((0, 0, 2), (1, 1, 2))]:
        assert Diagnoser().notes(_spawners(*apart)) == []
    mixed = Diagnoser().notes(_spawners((1, 2, 2), (1, 3, 4), (0, 0, 2)))
    assert [d.detail.split(":")[0] for d in mixed] == [
        "ranks 2, 3 on node 1 spawned workers of their own (each)"
    ]


class _Notes:
    def __init__(self):
        self.rank, self.notes = 1, []

    def note(self, code, **numbers):
        self.notes.append((code, numbers))


@pytest.mark.parametrize(
    ("env", "group", "said"),
    [
        # swav inside a Slurm job: rank 0 of a world of its own, rank 1 too
        ({"RANK": "1", "WORLD_SIZE": "2", "SLURM_JOB_ID": "7"}, (0, 1), (0, 1, True)),
        ({"RANK": "0", "WORLD_SIZE": "2", "SLURM_PROCID": "0"}, (0, 1), (0, 1, True)),
        ({"RANK": "1", "WORLD_SIZE": "2"}, (1, 4), (1, 4, False)),  # its own flags
        ({"RANK": "1", "WORLD_SIZE": "2"}, (1, 2), None),  # the launcher's world
    ],
)
def test_a_launched_rank_that_forms_another_world_says_so_and_keeps_its_rank(
    monkeypatch, env, group, said
):
    """swav's ``init_distributed_mode`` reads Slurm's variables before torchrun's: inside an
    allocation both ranks formed a world of their own, as rank 0 of 1; rank 1's events were
    taken as rank 0's (1 dropped, 1 rejected) and the run read "finished" with rank 1
    "preparing" throughout."""
    from ddptui.rank import reporter, spawned, world

    for name in ("RANK", "WORLD_SIZE", "SLURM_JOB_ID", "SLURM_PROCID", spawned.SPAWNED_ENV):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(spawned.ENDPOINT_ENV, "ipc:///nonexistent")
    monkeypatch.setattr(spawned, "_group_seen", False)
    monkeypatch.setattr(world, "launched", None)
    fake = _Notes()
    monkeypatch.setattr(reporter, "get_reporter", lambda: fake)
    spawned.on_process_group(*group)
    if said is None:
        assert fake.notes == []
        return
    group_rank, group_size, slurm = said
    assert fake.notes == [
        ("own_group", {"group_rank": group_rank, "group_size": group_size, "slurm": slurm})
    ]
    assert (os.environ["RANK"], os.environ["WORLD_SIZE"]) == (env["RANK"], "2")  # as launched
    assert fake.rank == 1  # untouched


def test_the_launchers_world_is_the_one_read_before_the_script_ran(monkeypatch):
    """A script that writes the world it computed into WORLD_SIZE before it forms its group:
    the launcher's world is the one the rank entry read."""
    from ddptui.rank import reporter, spawned, world

    monkeypatch.delenv(spawned.SPAWNED_ENV, raising=False)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv(spawned.ENDPOINT_ENV, "ipc:///nonexistent")
    monkeypatch.setattr(spawned, "_group_seen", False)
    monkeypatch.setattr(world, "launched", None)
    world.note_launch()
    monkeypatch.setenv("RANK", "0")  # the script's own, as swav's shape might write them
    monkeypatch.setenv("WORLD_SIZE", "1")
    fake = _Notes()
    monkeypatch.setattr(reporter, "get_reporter", lambda: fake)
    spawned.on_process_group(0, 1)
    assert [code for code, _ in fake.notes] == ["own_group"]
    assert fake.rank == 1


def test_a_rank_in_a_world_of_its_own_is_told_once():
    state = RunState("r", 2)
    for rank in (0, 1):
        state.apply(started(rank, 2), now=1.0)
        note = protocol.Note(
            run="r",
            rank=rank,
            t=0.0,
            seq=1,
            code="own_group",
            group_rank=0,
            group_size=1,
            slurm=rank == 0,
        )
        state.apply(note, now=2.0)
    diagnoser = Diagnoser()
    (found,) = diagnoser.notes(state)
    assert (found.rank, found.cause) == (0, "own_group")
    assert found.detail.startswith(
        "rank 0 formed its process group as rank 0 of 1, not in the world of the ranks ddptui "
        "launched: the ranks do not train together (a Slurm job's SLURM_PROCID"
    )
    assert diagnoser.notes(state) == []
    assert "own_group" in CAUSES


@pytest.mark.parametrize(
    "bad", [{"group_size": 0}, {"group_rank": -1}, {"slurm": "yes"}, {"group_size": 10**12}]
)
def test_an_own_group_note_out_of_bounds_is_refused(bad):
    raw = {"kind": "note", "v": 1, "run": "r", "rank": 0, "t": 0.0, "seq": 1}
    raw.update(code="own_group", group_rank=0, group_size=1, slurm=False)
    protocol.decode_batch(msgspec.msgpack.encode([raw]))  # in bounds
    raw.update(bad)
    with pytest.raises(protocol.InvalidEvent):
        protocol.decode_batch(msgspec.msgpack.encode([raw]))


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_ranks_that_each_form_a_world_of_their_own_are_both_seen(tmp_path):
    """tests/scripts/srun_ranks.py inside a Slurm job's variables (swav's shape), 2 ranks:
    both ranks' steps under their own ranks, and the note said."""
    from tests.helpers import ROOT

    run_dir = tmp_path / "run"
    env = {**os.environ, "SLURM_JOB_ID": "42", "SLURM_PROCID": "0", "SLURM_NNODES": "1"}
    env["SLURM_TASKS_PER_NODE"] = "1"
    proc = run_headless(
        ["--world-size", "2", "--script", str(ROOT / "tests/scripts/srun_ranks.py")], run_dir, env
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "formed its process group as rank 0 of 1" in proc.stdout
    events = read_events(run_dir)
    # an event of very fast steps stands for several (``steps``)
    assert [step_numbers(events, rank) for rank in (0, 1)] == [[1, 2, 3], [1, 2, 3]]
    assert "0 dropped" in proc.stdout


def test_a_failed_run_where_one_launched_copy_spawned_its_own_ranks_says_why():
    """NVlabs/stylegan3's ``train.py --gpus=2`` at ddptui's default of 2 ranks: the first copy
    made the output directory and spawned its 2 workers, the second failed making the same
    directory (``FileExistsError``) before it spawned any. One spawner is no spawners note;
    the failure's crash line now says that the script starts its ranks itself. One spawner a
    node of one launched process, or none, says nothing."""
    state = _spawners((None, 1, 2))
    assert Diagnoser().notes(state) == []  # one spawner: no note of its own
    hint = spawner_hint(state.spawners, per_node=2)
    assert hint.startswith("rank 1 spawned 2 workers of its own: the script starts its ranks")
    assert "ddptui launched 2 copies of it a node" in hint
    assert hint.endswith("launch it as one process a node (--world-size 1; --nproc-per-node 1 "
                         "on several nodes)")  # fmt: skip
    assert spawner_hint(state.spawners, per_node=1) is None  # launched as one: the script's way
    assert spawner_hint({}, per_node=2) is None
    both = _spawners((None, 0, 2), (None, 1, 2))  # said already, by the spawners note
    assert spawner_hint(both.spawners, per_node=2) is None
    apart = _spawners((0, 0, 2), (1, 2, 2))  # one a node, two launched each: each a whole set
    assert spawner_hint(apart.spawners, per_node=2).startswith("rank 0 spawned 2 workers")
