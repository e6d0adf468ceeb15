"""A script that spawns its own ranks (torch.multiprocessing.spawn, one process per GPU):
the run grows to the world its workers' process group declares, within bounds, and the
spawner goes quiet."""

import pytest

from ddptui import protocol
from ddptui.collector import Collector
from ddptui.reporter import Reporter
from ddptui.state import RunState


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
            got = []
            for _ in range(100):
                got += collector.poll(0.05)
                if collector.stats.implausible >= 2 and len(got) >= 2:
                    break
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
            got = []
            for _ in range(100):
                got += collector.poll(0.05)
                if len(got) >= 3:
                    break
        finally:
            rep.close()
    assert [(type(e).__name__, e.seq) for e in got] == [("Step", 0), ("Beat", 0), ("Step", 1)]
    replayed = RunState("r", 1)
    for event in got:
        if type(event) is not protocol.Beat:  # events.jsonl keeps few beats
            replayed.apply(event, now=1.0)
    assert replayed.dropped == 0
