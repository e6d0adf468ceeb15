"""The rank table's collective column and the rank that falls behind, live, from the Flight
Recorder progress in every rank's heartbeat (pure: RunState + the table model)."""

import msgspec
import pytest

from ddptui import protocol
from ddptui.run.state import RunState
from ddptui.tui.model import behind_ranks, collective_cell, run_frame, severity


def beat(
    rank,
    seq,
    started,
    completed,
    op=None,
    digest="d0",
    group="default_pg",
    backend="gloo",
    waiting=None,
):
    return protocol.Beat(
        run="r",
        rank=rank,
        t=0.0,
        seq=seq,
        digest=digest,
        cpu=1.0,
        frame="main (train.py:9)",
        waiting=waiting,
        collectives=[
            protocol.CollectiveMark(
                pg=group, op=op, started=started, completed=completed, backend=backend
            )
        ],
    )


def announced(world):
    state = RunState("r", world)
    for rank in range(world):
        status = protocol.Status(run="r", rank=rank, t=0, seq=0, state="started", pid=10 + rank)
        state.apply(status, now=0.0)
    return state


def test_the_cell_says_the_last_collective_started_and_whether_it_completed():
    one = [("default_pg", "all_reduce", 812, 811, "gloo")]
    assert collective_cell(one) == "all_reduce #812 …"
    assert collective_cell([("default_pg", None, 812, 812, None)]) == "#812 ✓"
    two = [("default_pg", None, 5, 5, "gloo"), ("tp", "all_gather", 9, 8, "gloo")]
    assert collective_cell(two) == "default_pg: #5 ✓; tp: all_gather #9 …"
    # one group on two backends (``cpu:gloo,cuda:nccl``) numbers each apart: both named
    both = [("default_pg", None, 3, 3, "gloo"), ("default_pg", "all_reduce", 40, 39, "nccl")]
    assert collective_cell(both) == "default_pg gloo: #3 ✓; default_pg nccl: all_reduce #40 …"
    assert collective_cell([]) == ""


LOST_PEER = """Traceback (most recent call last):
  File "/w/process_workers.py", line 103, in average_gradients
    dist.all_reduce(param.grad.data, op=dist.ReduceOp.SUM)
  File "/v/site-packages/torch/distributed/c10d_logger.py", line 81, in wrapper
    return func(*args, **kwargs)
  File "/v/site-packages/torch/distributed/distributed_c10d.py", line 4181, in all_reduce
    work.wait()
RuntimeError: [gloo/transport/tcp/pair.cc:561] Connection closed by peer [127.0.0.1]:11649
"""
OWN_ERROR = """Traceback (most recent call last):
  File "/w/process_workers.py", line 121, in run
    raise RuntimeError(f"injected failure on rank {rank} at step {steps + 1}")
RuntimeError: injected failure on rank 1 at step 7
"""


def test_a_rank_that_failed_inside_its_last_collective_shows_it_failed_not_completed():
    """The distributed tutorial's ranks, rank 1 raising before step 7's all_reduce: rank 0's
    all_reduce #25 raised on its lost peer, and gloo counts it completed: its row read
    ``all_reduce #25 ✓`` beside rank 1's ``#24 ✓``, as if rank 0 had got through. A rank
    that failed in its own code keeps its last collective's ✓."""
    state = announced(2)
    for rank, (error, trace) in enumerate(
        [("RuntimeError: Connection closed by peer", LOST_PEER), ("RuntimeError: x", OWN_ERROR)]
    ):
        view = state.ranks[rank]
        view.state, view.error, view.traceback = "failed", error, trace
        view.collectives = (("default_pg", "all_reduce", 25 - rank, 25 - rank, "gloo"),)
    cells = {row.rank: row.collective for row in run_frame(state, now=1.0).rows}
    assert cells == {0: "all_reduce #25 ✗", 1: "all_reduce #24 ✓"}
    # not yet completed (an NCCL wait that timed out): failed there too
    assert collective_cell([("default_pg", "all_reduce", 9, 8, "nccl")], True) == (
        "all_reduce #9 ✗"
    )
    # an error raised elsewhere in torch.distributed (a checkpoint's writer) is no collective's
    view = state.ranks[0]
    view.traceback = LOST_PEER.replace("distributed_c10d.py", "checkpoint/filesystem.py")
    assert run_frame(state, now=1.0).rows[0].collective == "all_reduce #25 ✓"
    # two groups: which one raised is not known, and neither is marked
    two = [("default_pg", None, 5, 5, "gloo"), ("tp", "all_gather", 9, 9, "gloo")]
    assert collective_cell(two, True) == "default_pg: #5 ✓; tp: all_gather #9 ✓"


def stuck_at(state, rank, started, completed, op=None, times=(1.0, 3.0, 5.0)):
    for i, t in enumerate(times):
        state.apply(beat(rank, i + 1, started, completed, op), now=t)


def test_a_rank_that_has_not_started_what_the_others_wait_in_is_behind():
    state = announced(3)
    stuck_at(state, 0, 17, 16, "all_reduce")
    stuck_at(state, 1, 17, 16, "all_reduce")
    stuck_at(state, 2, 16, 16)
    assert behind_ranks(state) == {2: "behind: at #16 while ranks 0, 1 wait(s) in all_reduce #17"}
    frame = run_frame(state, 5.0)
    row = frame.rows[2]
    assert severity(row) == "behind" and row.collective == "#16 ✓"
    assert frame.rows[0].collective == "all_reduce #17 …"
    assert 2 in frame.problems


def test_a_rank_that_evaluates_while_the_others_wait_is_not_behind():
    """nanoGPT's rank 0 evaluates alone (every ``eval_interval`` steps) while rank 1 waits in
    the next step's all-reduce: rank 0 reads ``evaluating``, not ``⚠ behind``."""
    state = announced(2)
    stuck_at(state, 1, 206, 205, "all_reduce")
    for i, t in enumerate((1.0, 3.0, 5.0)):
        mark = beat(0, i + 1, 205, 205, digest=f"d{i}")
        state.apply(msgspec.structs.replace(mark, evaluations=50 * (i + 1)), now=t)
    assert state.ranks[0].activity == "evaluating"
    assert behind_ranks(state) == {}
    frame = run_frame(state, 5.0)
    assert frame.rows[0].state == "evaluating" and 0 not in frame.problems
    assert frame.rows[1].collective == "all_reduce #206 …"
    stands = msgspec.structs.replace(beat(0, 4, 205, 205, digest="d9"), evaluations=150)
    state.apply(stands, now=7.0)  # its count stands: no longer evaluating
    state.apply(beat(1, 4, 206, 205, "all_reduce"), now=7.0)
    assert behind_ranks(state) == {0: "behind: at #205 while rank 1 wait(s) in all_reduce #206"}


def test_no_one_is_behind_in_a_moving_run_or_before_the_others_waited_a_beat():
    state = announced(2)
    state.apply(beat(0, 1, 17, 16, "all_reduce"), now=1.0)  # just entered
    state.apply(beat(1, 1, 16, 16), now=1.0)
    assert behind_ranks(state) == {}
    for i, t in enumerate((3.0, 5.0, 7.0)):  # both move on every beat
        state.apply(beat(0, i + 2, 18 + 2 * i, 17 + 2 * i), now=t)
        state.apply(beat(1, i + 2, 17 + 2 * i, 17 + 2 * i), now=t)
    assert behind_ranks(state) == {}


def test_groups_are_judged_apart():
    state = announced(2)
    for i, t in enumerate((1.0, 3.0, 5.0)):
        state.apply(beat(0, i + 1, 4, 3, "barrier", group="tp"), now=t)
        state.apply(beat(1, i + 1, 9, 9, group="default_pg"), now=t)
    assert behind_ranks(state) == {}  # rank 1 is not in group tp's progress at all


def test_a_groups_backends_are_judged_apart():
    """One group on gloo and NCCL (``cpu:gloo,cuda:nccl``): each backend numbers its own
    collectives, so rank 1's gloo #3 is not behind rank 0's NCCL #40."""
    state = announced(2)
    for i, t in enumerate((1.0, 3.0, 5.0)):
        state.apply(beat(0, i + 1, 40, 39, "all_reduce", backend="nccl"), now=t)
        state.apply(beat(1, i + 1, 3, 3, backend="gloo"), now=t)
    assert behind_ranks(state) == {}
    for i, t in enumerate((7.0, 9.0, 11.0)):
        state.apply(beat(1, i + 4, 39, 39, backend="nccl"), now=t)
    assert behind_ranks(state) == {1: "behind: at #39 while rank 0 wait(s) in all_reduce #40"}


# -- the session's warming of torch's analyzer ------------------------------------------------
def test_the_analyzer_is_loaded_once_a_rank_stands_still_or_fails(tmp_path, monkeypatch):
    """A failed rank's run reads the traces with torch's analyzer once the launcher ends: its
    import starts when a rank fails, not then (begun then, the summary came 3.3 s after the
    launcher's end on a slow machine, 1.7 s since). A failed rank that left no trace (its
    argument parser stopped it before its group formed) gives it nothing to read: torch was
    loaded for it all the same (3.3 s of CPU on a slow machine), and is not now."""
    from ddptui.run import flight
    from ddptui.run.config import build_config
    from ddptui.run.machine import Machine
    from ddptui.run.session import RunSession

    warmed = []
    monkeypatch.setattr(flight, "warm_analyzer", lambda: warmed.append(True))
    cfg = build_config({"run_dir": str(tmp_path / "run")}, Machine(0, "no GPU", 2))
    session = RunSession(cfg)
    session._flight_warm()  # no trace sockets: nothing to analyze
    session.fr_dir = tmp_path
    state = session.state
    for rank in (0, 1):
        status = protocol.Status(run="r", rank=rank, t=0, seq=0, state="started", pid=10 + rank)
        state.apply(status, now=0.0)
    state.apply(beat(0, 1, 3, 3), now=1.0)
    session._flight_warm()
    assert warmed == []  # every rank works
    failed = protocol.Status(run="r", rank=1, t=2, seq=1, state="failed", error="boom", pid=11)
    state.apply(failed, now=2.0)
    session._flight_warm()
    assert warmed == []  # no trace in the run directory
    session.files.path.mkdir(parents=True)
    (session.files.path / "fr-rank-1.json").write_text("{}")
    session._flight_warm()
    session._flight_warm()
    assert warmed == [True]  # once


def test_traces_without_a_collective_are_refused_before_torch_loads(monkeypatch):
    from ddptui.run import flight

    def loaded():
        raise AssertionError("torch's analyzer loaded for traces without a collective")

    monkeypatch.setattr(flight, "_import_analyzer", loaded)
    with pytest.raises(ValueError, match="no rank recorded a collective"):
        flight.analyze({0: {"entries": [], "version": "2.10"}}, 2)


def test_the_traces_the_session_asked_for_are_not_read_as_what_ranks_left_at_a_crash(
    tmp_path, monkeypatch
):
    """facebookresearch/moco's ranks stood in DDP's first broadcast long enough for the
    desync watch to ask for their traces; those files stay in the run directory. A rank killed
    outright later leaves none: its old file was read as its last word ("rank 1 never
    entered all_reduce #8 … last entered #7")."""
    import json
    import os
    import shutil

    from ddptui.run import flight
    from ddptui.run.config import build_config
    from ddptui.run.machine import Machine
    from ddptui.run.session import RunSession
    from tests.helpers import ROOT

    cfg = build_config({"run_dir": str(tmp_path / "run")}, Machine(0, "no GPU", 2))
    session = RunSession(cfg)
    session.fr_dir = tmp_path  # as if the ranks listened there
    run_dir = session.files.path
    run_dir.mkdir(parents=True)
    pids = {}
    for rank in (0, 1):
        path = run_dir / f"fr-rank-{rank}.json"
        shutil.copy(ROOT / "tests" / "data" / "fr" / "hang" / path.name, path)
        pids[rank] = json.loads(path.read_text())["pid"]
        status = protocol.Status(run="r", rank=rank, t=0, seq=0, state="started", pid=pids[rank])
        session.state.apply(status, now=0.0)
    monkeypatch.setattr(flight, "request_traces", lambda *a, **k: {0: "ok", 1: "ok"})
    session.flight_check(1.0, record=False)
    fresh = run_dir / "fresh.json"  # rank 0 fails and writes its trace again
    fresh.write_text((run_dir / "fr-rank-0.json").read_text())
    os.replace(fresh, run_dir / "fr-rank-0.json")
    killed = protocol.Status(run="r", rank=1, t=2, seq=1, state="failed", pid=pids[1])
    session.state.apply(killed, now=2.0)
    session._diagnose_crash()
    lines = [d.detail for d in session.diagnoser.diagnoses]
    assert not any("never entered" in line for line in lines), lines
    assert any(line.endswith("rank 1 left no trace") for line in lines), lines


# -- the session's live desync check -------------------------------------------------------
def test_every_rank_still_in_a_collective_asks_for_traces_once_and_a_desync_is_a_verdict(
    tmp_path, monkeypatch
):
    from ddptui.run import flight
    from ddptui.run.config import build_config
    from ddptui.run.diagnosis import Diagnosis
    from ddptui.run.machine import Machine
    from ddptui.run.session import RunSession

    cpu = Machine(0, "no GPU", 2)
    cfg = build_config({"run_dir": str(tmp_path / "run"), "on_hang": "keep"}, cpu)
    session = RunSession(cfg)
    session.fr_dir = tmp_path  # as if the ranks listened there
    line = "rank 1 called broadcast #17 (1 float) where rank 0 called all_reduce #17: a desync"
    asked = []

    def collect(socket_dir, run_dir, ranks, world, t, stacks=None, **_remote):
        asked.append(sorted(ranks))
        return [Diagnosis(1, "desync", line, t)], "Flight Recorder: traces of ranks 0, 1"

    monkeypatch.setattr(flight, "collect", collect)
    state = session.state
    for rank in (0, 1):
        status = protocol.Status(run="r", rank=rank, t=0, seq=0, state="started", pid=10 + rank)
        state.apply(status, now=0.0)
    state.apply(beat(0, 1, 17, 16, "all_reduce"), now=1.0)
    state.apply(beat(1, 1, 17, 16, "broadcast"), now=1.0)
    session._flight_watch(1.0)
    assert asked == []  # not still for a beat yet
    for t in (3.0, 5.0):  # gloo's marks open, but neither stack in a collective: marks lag
        state.apply(beat(0, int(t), 17, 16, "all_reduce"), now=t)
        state.apply(beat(1, int(t), 17, 16, "broadcast"), now=t)
        session._flight_watch(t)
    assert asked == []
    for t in (7.0, 9.0):
        state.apply(beat(0, int(t), 17, 16, "all_reduce", waiting="all_reduce"), now=t)
        state.apply(beat(1, int(t), 17, 16, "broadcast", waiting="broadcast"), now=t)
        session._flight_watch(t)
    assert asked == [[0, 1]]  # once for these waits
    assert [(d.rank, d.cause) for d in session.diagnoser.diagnoses] == [(1, "desync")]
    assert session.take_diagnoses()[0].detail == line
    assert session.flight_note == "Flight Recorder: traces of ranks 0, 1"


def test_a_rank_that_finished_is_in_no_collective_whatever_its_last_marks_said():
    """gloo marks a collective completed after it returns: moco's linear probe, finished,
    read ``broadcast #80 …`` on both ranks (DDP's buffer broadcast of its last forward)."""
    state = announced(2)
    for rank in (0, 1):
        view = state.ranks[rank]
        view.collectives = (("default_pg", "broadcast", 80, 79, "gloo"),)
    state.ranks[1].state = "finished"
    cells = {row.rank: row.collective for row in run_frame(state, now=1.0).rows}
    assert cells == {0: "broadcast #80 …", 1: "broadcast #80 ✓"}
