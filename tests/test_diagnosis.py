"""Diagnosis rules, table-driven: stragglers from phases, hangs, stack classification, crash
root cause, and the summary.json part. Pure: no processes, no sockets."""

import json
from pathlib import Path

import msgspec
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ddptui import protocol
from ddptui.constants import PHASES
from ddptui.run.diagnosis import (
    CAUSES,
    GROWTH_NOTE_BYTES_S,
    IDLE_IO_BYTES_PER_S,
    POLL_WAKES_PER_S,
    Diagnoser,
    Diagnosis,
    GrowthWatch,
    MemoryState,
    PhaseHistory,
    RankEnd,
    _seconds,
    classify_stack,
    diagnose_crash,
    diagnose_hang,
    diagnoses_for_summary,
    find_straggler,
    growth_diagnosis,
    hang_limit,
    no_comm_diagnosis,
    prepare_limit,
    rank_ends,
    stuck_ranks,
    working_ranks,
)
from ddptui.run.state import RankFailureInfo, RunState

STACKS = Path(__file__).parent / "data" / "stacks"


def phases(data=0.0, forward=0.0, backward=0.0, comm=0.0, optimizer=0.0, other=0.0, **custom):
    out = dict(
        data=data, forward=forward, backward=backward, comm=comm, optimizer=optimizer, other=other
    )
    out.update(custom)
    return out


# One step of 100 ms seen from each rank, by scenario.
BALANCED = phases(data=0.005, forward=0.03, backward=0.05, comm=0.01, optimizer=0.005)
VICTIM = phases(data=0.004, forward=0.01, backward=0.015, comm=0.066, optimizer=0.005)
INPUT_CULPRIT = phases(data=0.066, forward=0.01, backward=0.015, comm=0.004, optimizer=0.005)
COMPUTE_CULPRIT = phases(data=0.004, forward=0.02, backward=0.066, comm=0.005, optimizer=0.005)
COMM_BOUND = phases(data=0.005, forward=0.01, backward=0.02, comm=0.06, optimizer=0.005)


def history(per_rank, steps=10):
    h = PhaseHistory()
    for _ in range(steps):
        for rank, p in per_rank.items():
            h.add(rank, p)
    return h


def test_the_phase_window_says_how_many_steps_it_stands_for():
    """The phase bars and the headless table name the steps their medians are over: the
    window's length while steps come one an event (fewer at first), and the steps its events
    hold where a very fast script's events hold several ("last 30 steps" read for 30 events
    of up to 31 steps each)."""
    h = PhaseHistory(window=4)
    assert h.covered() == 0
    h.add(0, VICTIM)
    h.add(1, VICTIM)
    assert h.covered() == 1
    for _ in range(5):
        h.add(0, VICTIM)
    assert h.covered() == 4
    for steps in (3, 5):
        h.add(1, VICTIM, steps)
    assert h.covered() == 1 + 3 + 5
    for _ in range(4):
        h.add(1, VICTIM, 20)
    assert h.covered() == 80


@pytest.mark.parametrize(
    "per_rank, rank, cause, words",
    [
        ({0: VICTIM, 1: INPUT_CULPRIT}, 1, "input", "data wait 66 % of step vs 4 % median"),
        ({0: INPUT_CULPRIT, 1: VICTIM}, 0, "input", "data wait 66 %"),
        ({0: VICTIM, 1: COMPUTE_CULPRIT}, 1, "compute", "backward 66 % of step vs 15 % median"),
        (
            {0: VICTIM, 1: VICTIM, 2: COMPUTE_CULPRIT, 3: VICTIM},
            2,
            "compute",
            "the other ranks wait 66 % of their step in communication",
        ),
        ({0: VICTIM, 1: VICTIM, 2: VICTIM, 3: INPUT_CULPRIT}, 3, "input", "vs 4 % median"),
        ({0: COMM_BOUND, 1: COMM_BOUND}, None, "communication", "wait 60 % of their step"),
        ({0: BALANCED, 1: BALANCED}, None, None, None),
        ({0: BALANCED, 1: BALANCED, 2: BALANCED}, None, None, None),
    ],
)
def test_straggler_names_the_late_rank_not_its_victims(per_rank, rank, cause, words):
    found = find_straggler(history(per_rank), t=12.5)
    if cause is None:
        assert found is None
        return
    assert (found.rank, found.cause) == (rank, cause)
    assert words in found.detail
    assert found.t == 12.5


def test_equal_step_times_do_not_blame_the_waiting_rank():
    # DDP equalises step times: both ranks take 100 ms; only the phases tell them apart.
    h = history({0: VICTIM, 1: COMPUTE_CULPRIT})
    found = find_straggler(h)
    assert found.rank == 1 and "rank 0" not in found.detail


def test_straggler_needs_enough_steps_and_two_ranks():
    assert find_straggler(history({0: VICTIM, 1: INPUT_CULPRIT}, steps=4)) is None
    assert find_straggler(history({0: VICTIM}, steps=20)) is None
    assert find_straggler(PhaseHistory()) is None


def test_straggler_judges_only_the_live_ranks():
    h = history({0: VICTIM, 1: INPUT_CULPRIT, 2: VICTIM})
    assert find_straggler(h).rank == 1
    assert find_straggler(h, ranks=[0, 2]).rank is None  # rank 1 ended: not judged


@pytest.mark.parametrize(
    "cpu, cause",
    [
        ({1: 30.0}, "host"),  # computes ~90 % of its step on a third of a core
        ({1: 95.0}, "compute"),
        ({0: 10.0}, "compute"),  # the victim's CPU says nothing about the culprit
        ({1: float("nan")}, "compute"),
        (None, "compute"),
    ],
)
def test_a_compute_straggler_short_of_cpu_is_host(cpu, cause):
    found = find_straggler(history({0: VICTIM, 1: COMPUTE_CULPRIT}), cpu_percent=cpu)
    assert found.cause == cause
    if cause == "host":
        assert "gets 30 % CPU" in found.detail


def test_a_few_odd_steps_do_not_change_the_verdict():
    h = history({0: VICTIM, 1: INPUT_CULPRIT}, steps=20)
    for _ in range(5):  # a burst the other way (e.g. an evaluation on rank 0)
        h.add(0, INPUT_CULPRIT)
        h.add(1, VICTIM)
    assert find_straggler(h).rank == 1


@pytest.mark.parametrize(
    "bad",
    [
        {},
        {"data": 0.0, "comm": 0.0},
        {"data": float("inf")},
        {"data": -1.0},
        {"data": "x"},
        {"custom": 5.0},
    ],
)
def test_phase_history_ignores_steps_without_measurable_phases(bad):
    h = PhaseHistory()
    h.add(0, bad)
    assert h.steps(0) == 0


_PHASE_VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=0.0, max_value=1e300),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.booleans(),
    st.none(),
    st.text(max_size=3),
)


@settings(max_examples=300, deadline=None)
@example({"data": -1.0, "forward": 2.0})
@example({"data": float("nan"), "comm": 1.0})
@example({"data": float("inf"), "comm": 1.0})
@example({"data": 1e308, "forward": 1e308})
@example({"data": True, "comm": 0.5})
@example({"data": 2, "comm": 0.5})
@given(st.dictionaries(st.sampled_from([*PHASES, "augment"]), _PHASE_VALUES, max_size=9))
def test_phase_history_keeps_what_cleaning_each_phase_by_itself_keeps(values):
    """The fast path (every phase a finite, non-negative float) and the value-by-value
    cleaning keep the same shares, whatever the rank sent."""
    cleaned = [_seconds(values.get(p)) for p in PHASES]
    total = sum(cleaned)
    h = PhaseHistory(window=1)
    h.add(0, values)
    if not values or total <= 0:
        assert h.steps(0) == 0
    else:
        assert h.median_shares(0) == dict(zip(PHASES, [v / total for v in cleaned], strict=True))


def test_custom_phases_are_not_judged():
    h = PhaseHistory()
    h.add(0, phases(data=0.5, comm=0.5, augment=10.0))
    assert h.median_shares(0)["data"] == 0.5


# -- the running judgement --------------------------------------------------------------------
def step_event(rank, seq, p, step_time=0.1):
    return protocol.Step(
        run="r", rank=rank, t=0.0, seq=seq, step=seq + 1, step_time=step_time, phases=p
    )


def live_state(per_rank, steps=10):
    state = RunState("r", len(per_rank))
    for i in range(steps):
        for rank, p in per_rank.items():
            state.apply(step_event(rank, i, p), now=float(i))
    return state


def test_diagnoser_reports_a_straggler_once_after_it_held():
    state = live_state({0: VICTIM, 1: INPUT_CULPRIT})
    d = Diagnoser(hang_timeout=0)
    assert d.check(state, 9.5) == []  # the last steps came at 9.0: the ranks still step
    assert d.check(state, 10.0) == []
    (found,) = d.check(state, 10.5)
    assert (found.rank, found.cause) == (1, "input")
    assert found.t == pytest.approx(10.5)
    assert d.check(state, 11.0) == []
    assert d.diagnoses == [found]


def test_no_straggler_is_named_from_the_steps_of_ranks_that_stopped_stepping():
    """A rank that hangs (or waits for rank 0's evaluation) is not judged on its old steps:
    the hang verdict, or nothing, says what it is. One was once named a compute straggler
    while it hung."""
    state = live_state({0: VICTIM, 1: INPUT_CULPRIT})  # last steps at 9.0
    d = Diagnoser(hang_timeout=0, confirm=1)
    assert d.check(state, 30.0) == []  # 21 s without a step: no rank is judged
    for i in range(10, 12):  # rank 0 steps again, rank 1 does not
        state.apply(step_event(0, i, VICTIM), now=30.0 + i)
    assert d.check(state, 42.0) == []  # one rank stepping: nobody to compare it with


def test_diagnoser_says_nothing_once_the_run_ended():
    state = live_state({0: VICTIM, 1: INPUT_CULPRIT})
    state.set_outcome("finished")
    d = Diagnoser(confirm=1)
    assert d.check(state, 100.0) == []


def test_final_verdict_needs_a_full_window_of_steps():
    state = live_state({0: VICTIM, 1: COMPUTE_CULPRIT}, steps=20)
    for rank in (0, 1):
        state.apply(protocol.Status(run="r", rank=rank, t=0, seq=99, state="finished"), 10.5)
    assert Diagnoser(hang_timeout=0).final(state, 11.0) == []  # 20 steps: noise, no verdict


def test_final_verdict_of_a_run_too_short_for_the_live_one():
    state = live_state({0: VICTIM, 1: COMPUTE_CULPRIT}, steps=30)
    d = Diagnoser(hang_timeout=0)
    assert d.check(state, 10.0) == []  # not held long enough yet
    for rank in (0, 1):  # the ranks end: no longer live
        state.apply(protocol.Status(run="r", rank=rank, t=0, seq=99, state="finished"), 10.5)
    (found,) = d.final(state, 11.0)
    assert (found.rank, found.cause) == (1, "compute")
    assert d.final(state, 12.0) == []  # said once
    assert d.diagnoses == [found]


def test_final_verdict_does_not_repeat_the_live_one():
    state = live_state({0: VICTIM, 1: INPUT_CULPRIT})
    d = Diagnoser(hang_timeout=0, confirm=1)
    assert len(d.check(state, 10.0)) == 1
    assert d.final(state, 11.0) == []


def test_a_paused_culprit_is_not_called_host_for_the_cpu_it_idles_away():
    """nanoGPT's rank 0 alone evaluates while rank 1 waits in the gradient all-reduce: rank 1's
    CPU then says nothing of its steps (it was once named "host, gets 6 % CPU" there)."""
    state = RunState("r", 2)
    for i in range(30):  # a full window, for the final verdict too
        for rank, p in ((0, VICTIM), (1, COMPUTE_CULPRIT)):
            ev = protocol.Step(
                run="r", rank=rank, t=0.0, seq=i, step=i + 1, step_time=0.1, samples=64,
                samples_per_s=640.0, phases=p,
            )  # fmt: skip
            state.apply(ev, now=float(i))
    starved = {1: 30.0}
    (found,) = Diagnoser(hang_timeout=0, confirm=1).check(state, 29.5, starved)
    assert (found.rank, found.cause) == (1, "host")  # stepping: its CPU is its steps'
    # 31 s since its last step: not judged live at all, and at the end not called "host"
    assert Diagnoser(hang_timeout=0, confirm=1).check(state, 60.0, starved) == []
    (found,) = Diagnoser(hang_timeout=0).final(state, 60.0, starved)
    assert (found.rank, found.cause) == (1, "compute")


# -- hangs ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "step_time, timeout, limit",
    [
        (None, None, 60.0),
        (0.1, None, 60.0),
        (5.0, None, 100.0),  # 20 x the median step time
        (5.0, 10, 10.0),
        (5.0, 0, None),  # off
        (5.0, 0.5, 0.5),
    ],
)
def test_hang_limit(step_time, timeout, limit):
    state = RunState("r", 2)
    if step_time is not None:
        for i in range(3):
            state.apply(step_event(0, i, None, step_time), now=float(i))
    assert hang_limit(state, timeout) == limit


def beat(
    rank,
    seq,
    digest="d0",
    cpu=1.0,
    frame="main (train.py:9)",
    waiting=None,
    steps=0,
    io=None,
    wakes=None,
):
    return protocol.Beat(
        run="r",
        rank=rank,
        t=0.0,
        seq=seq,
        digest=digest,
        cpu=cpu,
        frame=frame,
        waiting=waiting,
        steps=steps,
        io=io,
        wakes=wakes,
    )


def beating(state, rank, start, end, every=2.0, digest=lambda t: "d0", cpu=lambda t: 1.0):
    """Beats of ``rank`` from ``start`` to ``end`` (now), with the digest and CPU given."""
    t = start
    while t <= end + 1e-9:
        state.apply(beat(rank, int(t * 10), digest(t), cpu(t)), now=t)
        t += every


def announced(world):
    state = RunState("r", world)
    for rank in range(world):
        status = protocol.Status(run="r", rank=rank, t=0, seq=0, state="started", pid=10 + rank)
        state.apply(status, now=0.0)
    return state


def test_silence_alone_is_never_a_hang():
    state = announced(3)
    state.apply(step_event(0, 1, None), now=1.0)  # then nothing at all for 500 s
    assert stuck_ranks(state, 500.0, 10.0, 10.0) == {}
    assert stuck_ranks(state, 500.0, 10.0, 10.0, cpu_percent={0: 0.0, 1: 0.0, 2: 0.0}) == {}


def test_a_busy_preparing_rank_is_not_stuck_however_long():
    """Tokenising before the first step: the stack stays in one function, the CPU is busy."""
    state = announced(2)
    beating(state, 0, 0.5, 200.0, cpu=lambda t: t * 0.98)
    beating(state, 1, 0.5, 200.0, digest=lambda t: f"d{int(t)}", cpu=lambda t: 0.0)
    assert stuck_ranks(state, 200.0, 10.0, 10.0) == {}


def test_a_still_idle_rank_is_stuck_after_the_limit_and_not_before():
    state = announced(2)
    beating(state, 0, 0.5, 30.0, digest=lambda t: "a" if t < 15 else "b", cpu=lambda t: 3.0)
    beating(state, 1, 0.5, 30.0, digest=lambda t: f"d{int(t)}", cpu=lambda t: t)
    assert stuck_ranks(state, 30.0, 20.0, 20.0) == {}  # still for 14 s only
    (stuck,) = stuck_ranks(state, 30.0, 10.0, 10.0).values()
    assert stuck.rank == 0 and 11 <= stuck.seconds <= 16 and stuck.cpu == 0.0
    assert "rank 0 at main (train.py:9): stack unchanged for 12 s" in stuck.describe()


@pytest.mark.parametrize(
    ("bytes_per_s", "stuck"),
    [(5 * 2**20, False), (2 * IDLE_IO_BYTES_PER_S, False), (IDLE_IO_BYTES_PER_S / 4, True)],
)
def test_a_still_idle_rank_that_writes_to_storage_is_not_stuck(bytes_per_s, stuck):
    """A checkpoint written to slow storage: the stack in one write, the CPU idle, the bytes
    going out. Writing is work; a trickle (a log line now and then) is not."""
    state = announced(1)
    state.apply(step_event(0, 1, None), now=1.0)
    t = 2.0
    while t <= 40.0:
        state.apply(beat(0, int(t * 10), "w", 1.0, io=int(1000 + bytes_per_s * t)), now=t)
        t += 2.0
    assert bool(stuck_ranks(state, 40.0, 10.0, 10.0)) is stuck
    state.apply(beat(0, 410, "w", 1.0, io=5), now=41.0)  # the counter went back (a new process)
    assert stuck_ranks(state, 41.0, 10.0, 10.0) == {}  # stillness counts from there


@pytest.mark.parametrize(
    ("wakes_per_s", "waiting", "stuck"),
    [
        (2.0, None, False),  # while not exists(path): time.sleep(0.5)
        (POLL_WAKES_PER_S, None, False),
        (0.2, None, True),  # a DataLoader checking its hung worker every 5 s
        (0.0, None, True),  # one long call: a lock, a read, time.sleep(10**9)
        (2.0, "barrier", True),  # in a collective: judged as a wait, whatever wakes it
    ],
)
def test_a_still_idle_rank_whose_thread_wakes_often_polls_and_is_not_stuck(
    wakes_per_s, waiting, stuck
):
    """A loop that waits a moment at a time (a staged file, a flag): its stack sampled at
    the same line, its CPU idle, its thread sleeping and waking each time round."""
    state = announced(1)
    t = 1.0
    while t <= 40.0:
        wakes = int(100 + wakes_per_s * t)
        state.apply(beat(0, int(t * 10), "w", 1.0, waiting=waiting, wakes=wakes), now=t)
        t += 1.0
    assert bool(stuck_ranks(state, 40.0, 10.0, 10.0)) is stuck
    if not stuck:  # a count that went back: another thread sampled; stillness from there
        state.apply(beat(0, 410, "w", 1.0, wakes=3), now=41.0)
        assert state.ranks[0].wakes_while_still == 0


def test_a_rank_waiting_for_a_polling_rank_is_told_so_and_not_hung():
    """Rank 0 polls for a file while rank 1 waits in a barrier: the note, no verdict."""
    state = announced(2)
    t = 1.0
    while t <= 30.0:
        state.apply(
            beat(0, int(t * 10), "p", 1.0, frame="<module> (w.py:8)", wakes=int(2 * t)), now=t
        )
        state.apply(beat(1, int(t * 10), "b", 1.0, waiting="barrier", wakes=5), now=t)
        t += 1.0
    diagnoser = Diagnoser(hang_timeout=10)
    found = diagnoser.check(state, 30.0) + diagnoser.check(state, 31.0)
    assert [d.cause for d in found] == ["waiting"]
    assert found[0].detail.startswith("rank 1 stood still for ")
    assert "waiting for rank 0, which works (at <module> (w.py:8)), its stack in one place for" in (
        found[0].detail
    )
    assert "waking 2.0 times a second (a loop that waits): not a hang while it does" in (
        found[0].detail
    )


def test_a_step_is_progress():
    state = announced(1)
    beating(state, 0, 0.5, 20.0)
    state.apply(step_event(0, 500, None), now=20.5)
    beating(state, 0, 22.5, 28.5)
    assert stuck_ranks(state, 28.6, 10.0, 10.0) == {}


def test_before_the_first_step_the_default_limit_is_the_longer_preparation_one():
    assert prepare_limit(60.0, None) == 300.0
    assert prepare_limit(600.0, None) == 600.0
    assert prepare_limit(10.0, 10.0) == 10.0  # --hang-timeout holds before the first step too
    assert prepare_limit(None, 0) is None


def test_a_rank_whose_heartbeat_stopped_is_stuck_only_when_its_cpu_idles():
    state = announced(2)
    beating(state, 0, 0.5, 10.5)  # then its beats stop (the GIL held, or stopped)
    beating(state, 1, 0.5, 40.0, digest=lambda t: f"d{int(t)}", cpu=lambda t: t)
    assert stuck_ranks(state, 40.0, 20.0, 20.0) == {}  # CPU not sampled: no evidence
    assert stuck_ranks(state, 40.0, 20.0, 20.0, cpu_percent={0: 100.0}) == {}
    (stuck,) = stuck_ranks(state, 40.0, 20.0, 20.0, cpu_percent={0: 0.0}).values()
    assert stuck.how == "silent" and stuck.rank == 0
    state.set_outcome("failed")
    assert stuck_ranks(state, 40.0, 20.0, 20.0, cpu_percent={0: 0.0}) == {}


def test_a_silent_rank_whose_io_moves_is_not_stuck():
    """A C call that keeps the GIL while it waits on storage or a pipe (``import torch`` from
    a network file system, a loader reading a streamed checkpoint): no beats, the CPU idle,
    and only ddptui's own sample of its I/O says it works."""
    state = announced(2)
    beating(state, 0, 0.5, 10.5)  # then its beats stop
    beating(state, 1, 0.5, 40.0, digest=lambda t: f"d{int(t)}", cpu=lambda t: t)
    idle = {0: 0.0}
    reading = {0: 4 * IDLE_IO_BYTES_PER_S}
    assert stuck_ranks(state, 40.0, 20.0, 20.0, idle, io_rate=reading) == {}
    for trickle in ({0: IDLE_IO_BYTES_PER_S / 2}, {1: 4 * IDLE_IO_BYTES_PER_S}, {}, None):
        (stuck,) = stuck_ranks(state, 40.0, 20.0, 20.0, idle, io_rate=trickle).values()
        assert stuck.how == "silent" and stuck.rank == 0


def test_a_spawner_waiting_for_its_workers_group_is_never_stuck():
    """A script's own mp.spawn: its process (rank 0 until its workers announce themselves)
    stopped beating when it spawned, and idles while they import torch and meet. Spawned
    workers that took longer than ``--hang-timeout 5`` to form their group on a loaded machine
    had the spawner judged hung ("rank 0 hung outside any collective, in <module>", its
    mp.spawn line) and the healthy run torn down."""
    state = announced(1)
    beating(state, 0, 0.5, 2.0)  # then it spawns: its heartbeat stops
    state.apply(protocol.Note(run="r", rank=0, t=0.0, seq=50, code="spawned", workers=2), now=2.0)
    assert stuck_ranks(state, 40.0, 5.0, 5.0, cpu_percent={0: 0.0}) == {}
    started = protocol.Status(run="r", rank=0, t=0.0, seq=0, state="started", pid=4242)
    state.apply(started, now=41.0)  # a worker is rank 0 now: judged as any rank
    beating(state, 0, 41.5, 60.0)
    (stuck,) = stuck_ranks(state, 60.0, 5.0, 5.0, cpu_percent={0: 0.0}).values()
    assert stuck.rank == 0


def _waiting_for_rank_0(
    state, start, end, rank0_cpu=lambda t: t * 0.98, rank0_digest=lambda t: "d0"
):
    """From ``start`` to ``end``: rank 0 alone works (a checkpoint: its stack in one place,
    its CPU as given) while rank 1 waits for it in a barrier, idle. Both stepped before."""
    if start <= 2.0:
        for rank in (0, 1):
            state.apply(step_event(rank, 1, None), now=1.0)
    t = start
    while t <= end + 1e-9:
        state.apply(beat(0, int(t * 10), rank0_digest(t), rank0_cpu(t)), now=t)
        state.apply(beat(1, int(t * 10), "w", 1.0, waiting="barrier"), now=t)
        t += 2.0


def test_ranks_waiting_for_a_rank_that_works_are_not_a_hang():
    """A rank-0 checkpoint (or evaluation) longer than the limit: rank 1 stood still in a
    barrier, idle, past the limit; rank 0 works all along. A note, no verdict, however long."""
    state = announced(2)
    _waiting_for_rank_0(state, 2.0, 30.0)
    assert set(stuck_ranks(state, 30.0, 10.0, 10.0)) == {1}
    assert working_ranks(state, 30.0, stuck_ranks(state, 30.0, 10.0, 10.0)) == [0]
    d = Diagnoser(hang_timeout=10)
    (waiting,) = d.check(state, 30.0)
    assert waiting.cause == "waiting" and d.hang is None
    assert waiting.detail.startswith("rank 1 stood still for ")
    assert "(in barrier), waiting for rank 0, which works (at main (train.py:9))" in waiting.detail
    # rank 0's stack stood in one place all along (busy): one long call, or an endless loop
    assert "its stack in one place for 28 s (one long call, or a loop that never ends)" in (
        waiting.detail
    )
    _waiting_for_rank_0(state, 32.0, 200.0)
    assert d.check(state, 200.0) == [] and d.hang is None  # said once; still no verdict


def test_a_working_rank_whose_stack_moves_is_not_said_to_stand_in_one_place():
    state = announced(2)
    _waiting_for_rank_0(state, 2.0, 30.0, rank0_digest=lambda t: f"d{t}")
    (waiting,) = Diagnoser(hang_timeout=10).check(state, 30.0)
    assert waiting.cause == "waiting" and "in one place" not in waiting.detail
    # a short limit: the two beats' allowance never makes a moving stack one in one place
    state = announced(2)
    _waiting_for_rank_0(state, 2.0, 4.0, rank0_digest=lambda t: f"d{t}")
    (waiting,) = Diagnoser(hang_timeout=2).check(state, 4.0)
    assert waiting.cause == "waiting" and "in one place" not in waiting.detail


def test_a_stack_in_one_place_is_read_to_the_beats_own_resolution():
    """Each rank's stillness is read at its own beats, one a second (so up to a beat late at
    the start and a beat early at the end). Rank 1 waits in an all-reduce from 1.0 s (its
    beats at whole seconds: still for 5 s at 6.0); rank 0 spins in one loop from 1.0 s, but its
    beats fall just before the whole seconds: its first in the loop at 1.95, its last at 4.95,
    so its stack read still for 3 s, under three quarters of 5 s, though it stood in one place
    as long as rank 1 did (.ci/run once saw the endless loop without "in one place" so)."""
    state = announced(2)
    for rank in (0, 1):
        state.apply(step_event(rank, 1, None), now=0.5)
    t = 1.0
    while t <= 6.0 + 1e-9:
        state.apply(beat(1, int(t * 10), "w", 1.0, waiting="all_reduce"), now=t)
        t += 1.0
    t = 0.95
    while t <= 5.0:
        digest = "step" if t < 1.0 else "spin"
        state.apply(beat(0, int(t * 100), digest, t * 0.98, frame="spin (f.py:87)"), now=t)
        t += 1.0
    (waiting,) = Diagnoser(hang_timeout=5).check(state, 6.0)
    assert waiting.cause == "waiting", waiting
    assert "which works (at spin (f.py:87)), its stack in one place for 3 s" in waiting.detail


def test_once_the_working_rank_stands_still_too_it_is_a_hang():
    state = announced(2)
    # rank 0 works until 20 s, then goes on (its stack moves) and stands still, idle
    busy = {"rank0_cpu": lambda t: min(t, 20.0), "rank0_digest": lambda t: "d0" if t < 20 else "d1"}
    d = Diagnoser(hang_timeout=10)
    _waiting_for_rank_0(state, 2.0, 24.0, **busy)
    assert d.check(state, 24.0)[0].cause == "waiting"
    _waiting_for_rank_0(state, 26.0, 40.0, **busy)
    (hang,) = d.check(state, 40.0)
    assert hang.cause == "hang" and set(d.hung) == {0, 1}


def test_one_beat_that_caught_a_working_rank_in_a_collectives_code_is_no_wait():
    """nanoGPT's rank-0 estimate_loss runs its batches through the DDP module while rank 1
    waits in the next gradient all-reduce, idle. Rank 0's stack moves from beat to beat; one
    beat sampled it inside DDP's code. One sample of a moving stack is no wait: rank 0 works
    and rank 1 waits for it. Two beats standing still there are one."""
    state = announced(2)
    for rank in (0, 1):
        state.apply(step_event(rank, 1, None), now=1.0)
    t = 2.0
    while t <= 30.0:
        label = "DDP bucket rebuild broadcast" if t >= 30.0 else None
        state.apply(beat(0, int(t * 10), f"d{t}", t * 0.98, waiting=label), now=t)
        state.apply(beat(1, int(t * 10), "w", 1.0, waiting="DDP gradient all-reduce"), now=t)
        t += 2.0
    stuck = stuck_ranks(state, 30.0, 10.0, 10.0)
    assert set(stuck) == {1} and working_ranks(state, 30.0, stuck) == [0]
    d = Diagnoser(hang_timeout=10)
    (found,) = d.check(state, 30.0)
    assert found.cause == "waiting" and d.hang is None
    # rank 0 stands still in DDP's code from then on (its digest no longer moves): a wait
    state.apply(beat(0, 320, "d30.0", 31.0, waiting="DDP bucket rebuild broadcast"), now=32.0)
    state.apply(beat(1, 320, "w", 1.0, waiting="DDP gradient all-reduce"), now=32.0)
    assert working_ranks(state, 32.0, stuck_ranks(state, 32.0, 10.0, 10.0)) == []


@pytest.mark.parametrize("how", ["stack", "flight recorder"])
def test_a_busy_rank_that_waits_in_a_collective_itself_is_no_work(how):
    """Rank 1 hung outside any collective, idle; rank 0 waits for it in an NCCL all-reduce
    and burns CPU (a CUDA synchronisation spins): a hang, as it always was."""
    state = announced(2)
    for rank in (0, 1):
        state.apply(step_event(rank, 1, None), now=1.0)
    marks = [
        protocol.CollectiveMark(pg="0", op="allreduce", started=14, completed=13, backend="nccl")
    ]
    t = 2.0
    while t <= 30.0:
        busy = beat(0, int(t * 10), "s", t, waiting="all_reduce" if how == "stack" else None)
        if how == "flight recorder":
            busy = msgspec.structs.replace(busy, collectives=marks)
        state.apply(busy, now=t)
        state.apply(beat(1, int(t * 10), "h", 1.0), now=t)
        t += 2.0
    stuck = stuck_ranks(state, 30.0, 10.0, 10.0)
    assert set(stuck) == {1} and working_ranks(state, 30.0, stuck) == []
    (hang,) = Diagnoser(hang_timeout=10).check(state, 30.0)
    assert hang.cause == "hang"


@pytest.mark.parametrize("rank1_completed, hang", [(13, False), (12, True)])
def test_a_flight_recorder_mark_another_rank_completed_is_stale(rank1_completed, hang):
    """A recorder left rank 0's last all-reduces started and not completed (#13, completed
    #11) while rank 0 went on to a long rank-0 save (its stack there, its CPU busy); rank 1
    waits in the barrier after it, having completed #13. #13 is done: rank 0 waits in no
    collective, it works, and rank 1 waits for it (gloo's recorder did this in the real-world
    tier's long_prep run under load, and the run was torn down as hung; the marks here say
    NCCL, which is read). Had no rank completed #13, rank 0's mark would stand: a rank
    waiting in a collective is no work."""
    state = announced(2)
    for rank in (0, 1):
        state.apply(step_event(rank, 1, None), now=1.0)
    mine = [
        protocol.CollectiveMark(
            pg="default_pg", op="all_reduce", started=13, completed=11, backend="nccl"
        )
    ]
    theirs = [
        protocol.CollectiveMark(
            pg="default_pg", op="barrier", started=14, completed=rank1_completed, backend="nccl"
        )
    ]
    t = 2.0
    while t <= 30.0:
        busy = msgspec.structs.replace(beat(0, int(t * 10), "d0", t * 0.98), collectives=mine)
        idle = beat(1, int(t * 10), "w", 1.0, waiting="barrier")
        state.apply(busy, now=t)
        state.apply(msgspec.structs.replace(idle, collectives=theirs), now=t)
        t += 2.0
    stuck = stuck_ranks(state, 30.0, 10.0, 10.0)
    assert set(stuck) == {1}
    assert working_ranks(state, 30.0, stuck) == ([] if hang else [0])
    d = Diagnoser(hang_timeout=10)
    (found,) = d.check(state, 30.0)
    assert found.cause == ("hang" if hang else "waiting")
    assert (d.hang is not None) is hang


@pytest.mark.parametrize("backend, hang", [("gloo", False), ("nccl", True), (None, True)])
def test_gloo_marks_are_no_evidence_of_a_wait_even_stale_on_every_rank(backend, hang):
    """Both ranks' recorders lag at once: rank 0 (busy in a rank-0 save, its stack there)
    shows all_reduce #13 started, #11 completed; rank 1 (idle in the barrier after it, its
    stack says so) shows barrier #14 started, #11 completed. No rank shows #13 completed. A
    gloo wait blocks the thread that called it (it shows on the stack, and the CPU idles),
    so gloo's marks are not read: rank 0 works. An NCCL mark, or one whose backend a rank
    did not send, is read as before: rank 0 may be a host spinning in a CUDA sync."""
    state = announced(2)
    for rank in (0, 1):
        state.apply(step_event(rank, 1, None), now=1.0)

    def mark(op, started):
        return [
            protocol.CollectiveMark(
                pg="default_pg", op=op, started=started, completed=11, backend=backend
            )
        ]

    t = 2.0
    while t <= 30.0:
        busy = beat(0, int(t * 10), "d0", t * 0.98)
        idle = beat(1, int(t * 10), "w", 1.0, waiting="barrier")
        state.apply(msgspec.structs.replace(busy, collectives=mark("all_reduce", 13)), now=t)
        state.apply(msgspec.structs.replace(idle, collectives=mark("barrier", 14)), now=t)
        t += 2.0
    stuck = stuck_ranks(state, 30.0, 10.0, 10.0)
    assert set(stuck) == {1}
    assert working_ranks(state, 30.0, stuck) == ([] if hang else [0])
    (found,) = Diagnoser(hang_timeout=10).check(state, 30.0)
    assert found.cause == ("hang" if hang else "waiting")


def test_a_rank_whose_beats_stopped_works_only_by_ddptuis_own_cpu_sample():
    """A long call holding the GIL (its heartbeat cannot run): busy by ddptui's sample is
    work; unknown or idle is no evidence of it."""
    state = announced(2)
    for rank in (0, 1):
        state.apply(step_event(rank, 1, None), now=1.0)
    beating(state, 0, 2.0, 10.0)  # then its beats stop
    t = 2.0
    while t <= 40.0:
        state.apply(beat(1, int(t * 10), "w", 1.0, waiting="barrier"), now=t)
        t += 2.0
    stuck = {1: stuck_ranks(state, 40.0, 10.0, 10.0)[1]}
    assert working_ranks(state, 40.0, stuck) == []
    assert working_ranks(state, 40.0, stuck, cpu_percent={0: 0.5}) == []
    assert working_ranks(state, 40.0, stuck, cpu_percent={0: 99.0}) == [0]
    # its CPU idle, its I/O moving (a call that keeps the GIL while it reads): work
    moving = {0: 4 * IDLE_IO_BYTES_PER_S}
    assert working_ranks(state, 40.0, stuck, {0: 0.5}, io_rate=moving) == [0]
    assert working_ranks(state, 40.0, stuck, {0: 0.5}, io_rate={0: 100.0}) == []
    assert working_ranks(state, 40.0, stuck, None, io_rate=moving) == [0]


def test_a_stopped_rank_is_no_work_once_its_recent_cpu_idles():
    """pytorch/examples' imagenet, rank 1 stopped (SIGSTOP) mid-epoch: 22 s after its last
    beat the note said "waiting for rank 1, which works", read from its CPU averaged over
    20 s (busy until it was stopped). Work is what the rank does now: the recent sample."""
    state = announced(2)
    for rank in (0, 1):
        state.apply(step_event(rank, 1, None), now=1.0)
    beating(state, 0, 2.0, 10.0)  # rank 0's beats stop at 10 s: it was stopped
    t = 2.0
    while t <= 40.0:  # rank 1 stands still in a collective, waiting for rank 0
        state.apply(beat(1, int(t * 10), "w", 1.0, waiting="all_reduce"), now=t)
        t += 1.0
    mean_20s, last_5s = {0: 25.0, 1: 0.5}, {0: 0.0, 1: 0.5}
    d = Diagnoser(hang_timeout=10)
    (found,) = d.check(state, 40.0, mean_20s)  # the 20 s mean alone: "works"
    assert found.cause == "waiting" and "which works" in found.detail
    d = Diagnoser(hang_timeout=10)
    (found,) = d.check(state, 40.0, mean_20s, last_5s)
    assert found.cause == "hang" and "rank 1 in all_reduce" in found.detail
    silent = "rank 0, last seen at main (train.py:9): heartbeat silent for 38 s, CPU idle"
    assert silent in found.detail
    # Busy now, silent (a long call that holds the GIL): work, whatever the mean says.
    d = Diagnoser(hang_timeout=10)
    (found,) = d.check(state, 40.0, {0: 30.0, 1: 0.5}, {0: 99.0, 1: 0.5})
    assert found.cause == "waiting"
    # Idle now and silent, but reading (a call that keeps the GIL while it waits on storage).
    d = Diagnoser(hang_timeout=10)
    (found,) = d.check(state, 40.0, mean_20s, last_5s, {0: 1e6, 1: 0.0})
    assert found.cause == "waiting" and "which works" in found.detail


def test_diagnoser_reports_the_hang_once_with_its_evidence():
    state = announced(2)
    for rank in (0, 1):
        state.apply(step_event(rank, 1, None), now=1.0)
    d = Diagnoser(hang_timeout=10)
    beating(state, 0, 2.0, 8.0)
    beating(state, 1, 2.0, 8.0)
    assert d.check(state, 8.0) == []
    beating(state, 0, 10.0, 14.0)
    beating(state, 1, 10.0, 14.0)
    (hang,) = d.check(state, 14.0)
    assert hang.cause == "hang" and hang.rank is None
    assert "rank 0 at main (train.py:9): stack unchanged for 12 s" in hang.detail
    assert hang.detail.endswith("(limit 10 s)")
    assert d.check(state, 20.0) == []
    assert set(d.hung) == {0, 1}


# -- stacks -----------------------------------------------------------------------------------
def dump(*threads):
    """A faulthandler dump: threads given as lists of (file, line, func), innermost first."""
    out = []
    for i, frames in enumerate(threads):
        head = "Current thread" if i == len(threads) - 1 else "Thread"
        out.append(f"{head} 0x00007f{i:010x} (most recent call first):")
        out += [f'  File "{f}", line {n} in {fn}' for f, n, fn in frames]
        out.append("")
    return "\n".join(out)


TORCH = "/venv/lib/python3.11/site-packages/torch"
SCRIPT = "/home/me/train.py"
BOTTOM = [(SCRIPT, 80, "main"), (SCRIPT, 90, "<module>")]


@pytest.mark.parametrize(
    "frames, in_collective, collective, where",
    [
        (
            [(f"{TORCH}/distributed/distributed_c10d.py", 2500, "all_reduce"), *BOTTOM],
            True,
            "all_reduce",
            "main (train.py:80)",
        ),
        (
            [(f"{TORCH}/distributed/c10d_logger.py", 81, "wrapper"), *BOTTOM],
            True,
            "wrapper",
            "main (train.py:80)",
        ),
        (
            [
                (f"{TORCH}/autograd/graph.py", 829, "_engine_run_backward"),
                (f"{TORCH}/autograd/__init__.py", 364, "backward"),
                (f"{TORCH}/_tensor.py", 630, "backward"),
                *BOTTOM,
            ],
            True,
            "DDP gradient all-reduce, in backward",
            "main (train.py:80)",
        ),
        (
            [(f"{TORCH}/nn/parallel/distributed.py", 1700, "_sync_buffers"), *BOTTOM],
            True,
            "DDP buffers broadcast",
            "main (train.py:80)",
        ),
        (
            # facebookresearch/vicreg's rank 0 waiting for rank 1 before its forward: the
            # helper's name ("DDP _distributed_broadcast_coalesced") said nothing of it
            [
                (f"{TORCH}/nn/parallel/distributed.py", 2266, name)
                for name in (
                    "_distributed_broadcast_coalesced",
                    "_default_broadcast_coalesced",
                    "_sync_module_buffers",
                    "_sync_buffers",
                    "_pre_forward",
                    "forward",
                )
            ]
            + BOTTOM,
            True,
            "DDP buffers broadcast",
            "main (train.py:80)",
        ),
        (
            [
                (f"{TORCH}/nn/parallel/distributed.py", 339, "_distributed_broadcast_coalesced"),
                (f"{TORCH}/nn/parallel/distributed.py", 339, "_sync_params_and_buffers"),
                (f"{TORCH}/nn/parallel/distributed.py", 1097, "__init__"),
                *BOTTOM,
            ],
            True,
            "DDP setup broadcast",
            "main (train.py:80)",
        ),
        ([(SCRIPT, 12, "stall_forever"), *BOTTOM], False, None, "stall_forever (train.py:12)"),
        (
            [
                ("/usr/lib/python3.11/threading.py", 327, "wait"),
                ("/usr/lib/python3.11/queue.py", 180, "get"),
                (f"{TORCH}/utils/data/dataloader.py", 1130, "_try_get_data"),
                *BOTTOM,
            ],
            False,
            None,
            "main (train.py:80)",
        ),
        (
            # a user's own forward under DDP: the script's frame is innermost
            [(SCRIPT, 40, "forward"), (f"{TORCH}/nn/parallel/distributed.py", 1600, "forward")]
            + BOTTOM,
            False,
            None,
            "forward (train.py:40)",
        ),
        (
            # nanoGPT's rank-0 estimate_loss through its DDP module, caught in a forward hook
            # (ddptui's own) between DDP and the model: work, not a wait in "DDP
            # _run_ddp_forward" (one such sample once tore a healthy run down as hung)
            [
                ("/venv/lib/python3.11/site-packages/ddptui/rank/instrument.py", 906, "_eval"),
                (f"{TORCH}/nn/modules/module.py", 1790, "_call_impl"),
                (f"{TORCH}/nn/parallel/distributed.py", 1735, "_run_ddp_forward"),
                (f"{TORCH}/nn/parallel/distributed.py", 1910, "forward"),
                (f"{TORCH}/nn/modules/module.py", 1790, "_call_impl"),
                (SCRIPT, 225, "estimate_loss"),
                *BOTTOM,
            ],
            False,
            None,
            "estimate_loss (train.py:225)",
        ),
        (
            # a model of torch's own layers under DDP: the layer's code is innermost
            [
                (f"{TORCH}/nn/modules/linear.py", 134, "forward"),
                (f"{TORCH}/nn/modules/module.py", 1790, "_call_impl"),
                (f"{TORCH}/nn/parallel/distributed.py", 1735, "_run_ddp_forward"),
                (f"{TORCH}/nn/parallel/distributed.py", 1910, "forward"),
                *BOTTOM,
            ],
            False,
            None,
            "main (train.py:80)",
        ),
        (
            # DDP's own forward code running: the plumbing around the model's call
            [(f"{TORCH}/nn/parallel/distributed.py", 1908, "forward"), *BOTTOM],
            False,
            None,
            "main (train.py:80)",
        ),
        (
            # DDP rebuilding its buckets at the second forward (a broadcast in C++ beneath
            # _pre_forward): jik876/hifi-gan's rank 1 while rank 0 validated read "in DDP
            # _pre_forward"
            [
                (f"{TORCH}/nn/parallel/distributed.py", 1797, "_pre_forward"),
                (f"{TORCH}/nn/parallel/distributed.py", 1910, "forward"),
                *BOTTOM,
            ],
            True,
            "DDP bucket rebuild broadcast",
            "main (train.py:80)",
        ),
        (
            # a functional collective's wait, through torch's dispatcher
            [
                (f"{TORCH}/_ops.py", 1243, "__call__"),
                (f"{TORCH}/distributed/_functional_collectives.py", 140, "wait_tensor"),
                *BOTTOM,
            ],
            True,
            "wait_tensor",
            "main (train.py:80)",
        ),
        (
            # a module of torch.distributed being imported (seen once at a rank's start)
            [
                (f"{TORCH}/distributed/fsdp/__init__.py", 1, "<module>"),
                ("<frozen importlib._bootstrap>", 241, "_call_with_frames_removed"),
                *BOTTOM,
            ],
            False,
            None,
            "import torch.distributed.fsdp (train.py:80)",
        ),
        (
            # a helper torch.distributed runs while one of its modules is imported (seen in a
            # timm run at start): importing, not waiting
            [
                (f"{TORCH}/distributed/tensor/_ops/_pointwise_ops.py", 40, "_get_ops"),
                (f"{TORCH}/distributed/tensor/_ops/_pointwise_ops.py", 1, "<module>"),
                ("<frozen importlib._bootstrap>", 241, "_call_with_frames_removed"),
                ("<frozen importlib._bootstrap_external>", 940, "exec_module"),
                *BOTTOM,
            ],
            False,
            None,
            "import torch.distributed.tensor._ops._pointwise_ops (train.py:80)",
        ),
        (
            # a checkpoint written by torch.distributed.checkpoint: the writing is innermost
            [
                ("/usr/lib/python3.11/pickle.py", 500, "dump"),
                (f"{TORCH}/serialization.py", 900, "_save"),
                (f"{TORCH}/distributed/checkpoint/filesystem.py", 300, "_write_item"),
                *BOTTOM,
            ],
            False,
            None,
            "main (train.py:80)",
        ),
    ],
)
def test_classify_stack(frames, in_collective, collective, where):
    info = classify_stack(dump(frames))
    assert (info.in_collective, info.collective, info.where) == (in_collective, collective, where)


_IMPORT = ("<frozen importlib._bootstrap>", 241, "_call_with_frames_removed")


@pytest.mark.parametrize(
    "module_file, user, where",
    [
        # swav's logger.py importing pandas: read at a rank's start for five seconds as
        # ``<module> (__init__.py:15)``
        ("/venv/lib/python3.11/site-packages/pandas/__init__.py", True, "import pandas"),
        # the same, seen deeper: pandas importing its own modules (the outermost is named)
        ("/venv/lib/python3.11/site-packages/pandas/core/frame.py", True, "import pandas"),
        ("/usr/lib/python3/dist-packages/yaml/__init__.py", True, "import yaml"),
        ("/usr/lib/python3.11/json/decoder.py", True, "import json.decoder"),
        # a module of a package loaded long before (accelerate's init_trackers): its name
        (f"{TORCH}/utils/tensorboard/__init__.py", True, "import torch.utils.tensorboard"),
        ("C:\\Python311\\Lib\\site-packages\\numpy\\__init__.py", True, "import numpy"),
        ("/venv/lib/python3.11/site-packages/six.py", True, "import six"),
        # before the script's first line (ddptui's entry importing torch): no place
        (f"{TORCH}/__init__.py", False, "import torch"),
        # torch from a source checkout, outside any packages folder
        ("/home/me/pytorch/torch/__init__.py", False, "import torch"),
        ("/home/me/pytorch/torch/hub.py", False, "import hub"),
    ],
)
def test_a_rank_importing_names_the_module(module_file, user, where):
    from ddptui.rank.frames import Frame, classify, imported

    below = (
        [Frame(*f) for f in BOTTOM]
        if user
        else [Frame("/usr/lib/python3.11/runpy.py", 88, "_run_code")]
    )
    importing = [Frame(f"{TORCH}/_utils.py", 9, "helper"), Frame(module_file, 5, "<module>")]
    if module_file.endswith("/core/frame.py"):  # beneath the package's own __init__.py
        package = module_file.replace("core/frame.py", "__init__.py")
        importing += [Frame(*_IMPORT), Frame(package, 3, "<module>")]
    frames = [*importing, Frame(*_IMPORT), *below]
    info = classify(frames)
    assert not info.in_collective
    assert info.where == (f"{where} (train.py:80)" if user else where)
    assert imported(frames[: len(frames) - len(below)]) == where.removeprefix("import ")


def test_a_rank_in_torch_compile_says_so_and_a_compiled_forward_does_not():
    """rasbt/LLMs-from-scratch's DDP script compiles its model: its ranks read ``preparing``
    at ``calc_loss_batch (train_ddp.py:265)`` for 40 s of its first forward, and at the
    modules compilation imports. Dynamo's ``convert_frame.py`` is on a stack only while it
    compiles (the stacks below as torch 2.15 has them); a compiled forward run again is the
    script's work, as before."""
    from ddptui.rank.frames import Frame, classify

    compiled_call = [
        Frame(f"{TORCH}/_dynamo/eval_frame.py", 1265, "compile_wrapper"),
        Frame(f"{TORCH}/nn/modules/module.py", 1798, "_call_impl"),
        Frame(f"{TORCH}/nn/modules/module.py", 1787, "_wrapped_call_impl"),
        Frame(f"{TORCH}/_dynamo/eval_frame.py", 563, "__call__"),
    ]
    compiling = [
        Frame(f"{TORCH}/_inductor/compile_fx.py", 900, "compile_fx"),
        Frame(f"{TORCH}/_dynamo/output_graph.py", 3230, "call_user_compiler"),
        Frame(f"{TORCH}/_dynamo/symbolic_convert.py", 2218, "run"),
        Frame(f"{TORCH}/_dynamo/convert_frame.py", 2169, "_compile"),
        Frame(f"{TORCH}/_dynamo/convert_frame.py", 2714, "__call__"),
    ]
    below = [Frame(*f) for f in BOTTOM]
    info = classify([*compiling, *compiled_call, *below])
    assert (info.in_collective, info.where) == (False, "torch.compile (train.py:80)")
    # a module that compiling imports: still torch.compile's time
    importing = [Frame(f"{TORCH}/_inductor/codegen/cpp.py", 5, "<module>"), Frame(*_IMPORT)]
    info = classify([*importing, *compiling, *compiled_call, *below])
    assert info.where == "torch.compile (train.py:80)"
    # a compiled forward run again: the script's frame, as any forward's
    running = [Frame(f"{TORCH}/_dynamo/eval_frame.py", 1552, "_fn"), *compiled_call]
    info = classify([Frame(f"{TORCH}/nn/functional.py", 10, "linear"), *running, *below])
    assert (info.in_collective, info.where) == (False, "main (train.py:80)")
    # importing Dynamo (a rank's first optimizer does, through torch's ``_disable_dynamo``):
    # its convert_frame.py's module code runs, nothing compiles. The ddptui demo's ranks read
    # "torch.compile (synthetic.py:36)" at ``torch.optim.Adam(...)``.
    dynamo_import = [
        Frame(f"{TORCH}/_dynamo/convert_frame.py", 40, "<module>"),
        Frame(*_IMPORT),
        Frame(f"{TORCH}/_dynamo/__init__.py", 3, "<module>"),
        Frame(*_IMPORT),
        Frame(f"{TORCH}/_compile.py", 30, "inner"),
    ]
    info = classify([*dynamo_import, *below])
    assert info.where == "import torch._dynamo (train.py:80)"
    # Windows paths too
    windows = [Frame(f.file.replace("/", "\\"), f.line, f.func) for f in compiling]
    assert classify([*windows, *below]).where == "torch.compile (train.py:80)"


def test_an_import_not_yet_in_a_module_keeps_the_frame():
    """Importlib searching the path (a slow filesystem), no module's code run yet: the
    script's frame, as before."""
    from ddptui.rank.frames import Frame, classify, imported

    frames = [
        Frame("<frozen importlib._bootstrap_external>", 1500, "find_spec"),
        Frame(*_IMPORT),
        *(Frame(*f) for f in BOTTOM),
    ]
    assert imported(frames[:2]) is None
    assert classify(frames).where == "main (train.py:80)"
    assert imported([Frame(*f) for f in BOTTOM]) is None


def test_a_backward_waits_in_the_gradient_all_reduce_only_where_a_ddp_module_is():
    """pytorch/examples' ImageNet script makes no DDP module on the CPU: its ranks, seen in
    ``backward()``, read "DDP gradient all-reduce" where they computed their own gradients
    (the heartbeat tells ``classify`` whether the rank holds a DDP module)."""
    from ddptui.rank.frames import Frame, classify

    backward = [
        Frame(f"{TORCH}/autograd/graph.py", 829, "_engine_run_backward"),
        Frame(f"{TORCH}/autograd/__init__.py", 364, "backward"),
        Frame(f"{TORCH}/_tensor.py", 630, "backward"),
        *(Frame(*frame) for frame in BOTTOM),
    ]
    held = classify(backward)
    assert (held.in_collective, held.collective) == (True, "DDP gradient all-reduce, in backward")
    alone = classify(backward, ddp=False)
    assert (alone.in_collective, alone.collective, alone.where) == (
        False,
        None,
        "main (train.py:80)",
    )
    # Other collectives are what they are, DDP or not.
    barrier = [Frame(f"{TORCH}/distributed/distributed_c10d.py", 4000, "barrier")]
    assert classify(barrier + backward[3:], ddp=False).collective == "barrier"


def test_a_script_waiting_on_an_async_collectives_work_waits_in_a_collective():
    """``work = dist.all_reduce(t, async_op=True); work.wait()``: the wait is C++, and the
    innermost Python frame was the script's own line ("outside any collective"). ddptui's
    ``Work.wait`` stands in it; where torch's code called it, that code's collective is named."""
    from ddptui.rank import frames
    from ddptui.rank.frames import Frame, classify

    own = frames._PACKAGE + "/rank/instrument.py"
    wait = Frame(own, 2600, frames.ASYNC_WAIT)
    script = [Frame(SCRIPT, 73, "scaled_all_reduce"), *(Frame(*f) for f in BOTTOM)]
    info = classify([wait, *script])
    assert (info.in_collective, info.collective) == (True, "an async collective's wait()")
    assert info.where == "scaled_all_reduce (train.py:73)"
    zero = Frame(f"{TORCH}/distributed/optim/zero_redundancy_optimizer.py", 900, "_sync_params")
    assert classify([wait, zero, *script]).collective == "_sync_params"
    # ddptui's other frames are none of it; nor is a function of that name elsewhere
    assert not classify([Frame(own, 10, "clock"), *script]).in_collective
    assert not classify([Frame("/x/mine.py", 3, frames.ASYNC_WAIT), *script]).in_collective


def test_classify_stack_reads_the_main_thread_not_helpers():
    helper = [("/usr/lib/python3.11/threading.py", 331, "wait"), ("/x/worker.py", 5, "run")]
    main = [(f"{TORCH}/distributed/distributed_c10d.py", 4000, "barrier"), *BOTTOM]
    assert classify_stack(dump(helper, main)).collective == "barrier"
    assert classify_stack(dump(main, helper)).collective == "barrier"  # found by <module>


def test_classify_stack_reads_the_thread_the_rank_names_as_training():
    """A loop run in a thread the main thread joins (or in an RPC thread while the main
    thread waits in ``rpc.shutdown()``): the rank names that thread before its dump, and it
    is the one read. Read from the main thread, a rank waiting in DDP's all-reduce and its
    peer asleep in its loop were both "hung outside any collective" at ``t.join()``."""
    from ddptui.rank.stacks import STEPS_THREAD_MARK

    trainer = [
        (f"{TORCH}/autograd/graph.py", 829, "_engine_run_backward"),
        (f"{TORCH}/_tensor.py", 630, "backward"),
        (SCRIPT, 11, "train"),
        ("/usr/lib/python3.11/threading.py", 975, "run"),
    ]
    main = [("/usr/lib/python3.11/threading.py", 1119, "join"), (SCRIPT, 17, "<module>")]
    text = dump(trainer, main)  # the trainer is thread 0x00007f0000000000
    assert classify_stack(text).where == "<module> (train.py:17)"  # no name: the main thread
    named = f"{STEPS_THREAD_MARK}0x00007f0000000000\n{text}"
    info = classify_stack(named)
    assert (info.in_collective, info.collective) == (True, "DDP gradient all-reduce, in backward")
    assert info.where == "train (train.py:11)"
    gone = f"{STEPS_THREAD_MARK}0x00007f00000000ff\n{text}"  # a thread not in the dump
    assert classify_stack(gone).where == "<module> (train.py:17)"


@pytest.mark.parametrize("text", ["", "garbage\n\x00", "Thread 0x1 (most recent call first):\n"])
def test_classify_stack_survives_junk(text):
    assert classify_stack(text).in_collective is False


def test_real_captured_stacks_are_classified():
    """Dumps captured from a real hang of tests/scripts/plain_ddp.py (gloo, 2 ranks)."""
    culprit = classify_stack((STACKS / "hang-rank-1.txt").read_text())
    victim = classify_stack((STACKS / "hang-rank-0.txt").read_text())
    assert not culprit.in_collective and culprit.where.startswith("stall_forever (plain_ddp.py:")
    assert victim.in_collective


def test_diagnose_hang_names_the_rank_outside_the_collective():
    stacks = {
        0: dump([(f"{TORCH}/distributed/distributed_c10d.py", 1, "all_reduce"), *BOTTOM]),
        1: dump([(SCRIPT, 12, "stall_forever"), *BOTTOM]),
        2: dump([(f"{TORCH}/distributed/distributed_c10d.py", 1, "all_reduce"), *BOTTOM]),
    }
    out = diagnose_hang({0: 12.0, 1: 13.0, 2: 12.0}, stacks, 10.0, t=40.0)
    assert [(d.rank, d.cause) for d in out] == [(1, "hang"), (0, "collective"), (2, "collective")]
    assert out[0].detail.startswith(
        "rank 1 hung outside any collective, in stall_forever (train.py:12), while "
        "ranks 0, 2 wait in a collective (all_reduce); ranks 0, 1, 2 stood still for 13 s"
    )


def test_diagnose_hang_without_a_culprit_blames_the_run():
    coll = dump([(f"{TORCH}/distributed/distributed_c10d.py", 1, "barrier"), *BOTTOM])
    out = diagnose_hang({0: 12.0, 1: 12.0}, {0: coll, 1: coll}, 10.0, t=1.0)
    assert (out[0].rank, out[0].cause) == (None, "hang")
    assert "mismatched collectives" in out[0].detail
    (alone,) = diagnose_hang({0: 12.0}, {}, 10.0, t=1.0)
    assert "no stacks captured" in alone.detail
    # a rank on another node: no stack here, so nothing says every rank waits
    (remote, _) = diagnose_hang({0: 12.0, 1: 12.0}, {0: coll}, 10.0, t=1.0)
    assert remote.detail.endswith(
        "; rank 0 waits in a collective (barrier); no stack from rank 1"
    ), remote.detail


def test_diagnose_hang_does_not_read_a_cut_stack_as_the_ranks():
    """A dump that stops before its main thread's outermost frame (the rank paused in the
    middle of writing it; faulthandler writes the main thread last) holds only helper
    threads: read as the rank's, a rank waiting in the gradient all-reduce was named hung
    outside any collective beside the real culprit."""
    helper = [("/usr/lib/python3.11/threading.py", 331, "wait"), ("/x/threading.py", 9, "run")]
    victim = [(f"{TORCH}/autograd/graph.py", 1113, "_engine_run_backward"), *BOTTOM]
    culprit = dump([(SCRIPT, 43, "inject_fault"), *BOTTOM])
    whole = dump(helper, victim)
    cut = whole[: whole.index("Current thread")]
    assert classify_stack(cut).in_collective is False  # what it was taken for
    out = diagnose_hang({0: 6.0, 1: 6.0}, {0: cut, 1: culprit}, 5.0, t=9.0)
    assert [(d.rank, d.cause) for d in out] == [(1, "hang")]
    assert "while no rank with a whole stack waits in a collective" in out[0].detail
    assert out[0].detail.endswith("(limit 5 s); the stack of rank 0 was cut off")
    # whole, the same dump names rank 0 as waiting
    out = diagnose_hang({0: 6.0, 1: 6.0}, {0: whole, 1: culprit}, 5.0, t=9.0)
    assert [(d.rank, d.cause) for d in out] == [(1, "hang"), (0, "collective")]
    # every stack cut: the run as a whole, nobody named
    (alone,) = diagnose_hang({0: 6.0, 1: 6.0}, {0: cut, 1: cut}, 5.0, t=9.0)
    assert alone.rank is None and "the stack of ranks 0, 1 was cut off" in alone.detail


def test_diagnose_hang_reads_backward_as_work_on_a_rank_that_holds_no_ddp_module():
    """Its beats say a rank holds no DDP module (pytorch/examples' ImageNet script on the
    CPU): stood still in ``backward()``, it waits for no gradient all-reduce, it is stuck
    there. Without that word from its beats, ``backward()`` is DDP's wait, as before."""
    backward = dump([(f"{TORCH}/autograd/graph.py", 1113, "_engine_run_backward"), *BOTTOM])
    barrier = dump([(f"{TORCH}/distributed/distributed_c10d.py", 1, "barrier"), *BOTTOM])
    stacks = {0: backward, 1: barrier}
    out = diagnose_hang({0: 6.0, 1: 6.0}, stacks, 5.0, t=9.0, no_ddp={0, 1})
    assert [(d.rank, d.cause) for d in out] == [(0, "hang"), (1, "collective")]
    assert out[0].detail.startswith("rank 0 hung outside any collective, in main (train.py:")
    assert "while rank 1 waits in a collective (barrier)" in out[0].detail
    # a rank not said to be without DDP: its backward is the gradient all-reduce
    out = diagnose_hang({0: 6.0, 1: 6.0}, stacks, 5.0, t=9.0, no_ddp={1})
    causes = [(d.rank, d.cause) for d in out]
    assert causes == [(None, "hang"), (0, "collective"), (1, "collective")]
    assert out[1].detail.startswith("rank 0 waits in DDP gradient all-reduce, in backward")
    assert classify_stack(backward, ddp=False).in_collective is False


def test_the_session_names_a_rank_stuck_in_backward_without_ddp_by_its_beats(tmp_path, monkeypatch):
    """The session hands the diagnosis the ranks whose last beat said they hold no DDP
    module: their stacks in ``backward()`` are read as their own work."""
    from ddptui.run import session as session_module
    from ddptui.run.config import build_config
    from ddptui.run.machine import Machine

    backward = dump([(f"{TORCH}/autograd/graph.py", 1113, "_engine_run_backward"), *BOTTOM])
    barrier = dump([(f"{TORCH}/distributed/distributed_c10d.py", 1, "barrier"), *BOTTOM])
    monkeypatch.setattr(session_module, "capture_stacks", lambda *a, **k: {0: backward, 1: barrier})
    raw = {"run_dir": str(tmp_path / "run"), "world_size": "2"}
    run = session_module.RunSession(build_config(raw, Machine(0, "none", 2)))
    base = {"run": run.cfg.run_id, "t": 0.0, "seq": 0}
    for rank, ddp in ((0, False), (1, None)):
        run.state.apply(protocol.Status(state="started", pid=100 + rank, rank=rank, **base))
        run.state.apply(protocol.Beat(frame="main (train.py:80)", ddp=ddp, rank=rank, **base))
    run.diagnoser.hung = {0: 6.0, 1: 6.0}
    run.on_hang = "keep"
    run._on_hang(1.0)
    named = {(d.rank, d.cause) for d in run.diagnoser.diagnoses}
    assert {(0, "hang"), (1, "collective")} <= named, run.diagnoser.diagnoses


# -- crashes ----------------------------------------------------------------------------------
RESET = "RuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection closed by peer"


@pytest.mark.parametrize(
    "ends, launcher, memory, expect",
    [
        # the first to fail is the cause; the later "connection closed" is a consequence
        (
            [RankEnd(0, t=5.0, error=RESET), RankEnd(1, t=4.0, error="ValueError: bad")],
            0,
            None,
            [(1, "crash"), (0, "consequence")],
        ),
        # a consequence that happens to arrive first does not become the cause
        (
            [RankEnd(0, t=3.0, error=RESET), RankEnd(1, t=4.0, error="KeyError: 'x'")],
            0,
            None,
            [(1, "crash"), (0, "consequence")],
        ),
        # killed without a word, named by the launcher, memory full: likely OOM
        (
            [RankEnd(1, signal="SIGKILL", exit_code=-9), RankEnd(0, t=2.0, error=RESET)],
            1,
            MemoryState(host_fraction=0.98),
            [(1, "oom"), (0, "consequence")],
        ),
        (
            [RankEnd(1, signal="SIGKILL"), RankEnd(0, t=2.0, error=RESET)],
            1,
            MemoryState(oom_kills=1),
            [(1, "oom"), (0, "consequence")],
        ),
        (
            [RankEnd(1, signal="SIGKILL")],
            1,
            MemoryState(cgroup_current=990, cgroup_max=1000),
            [(1, "oom")],
        ),
        # SIGKILL with memory to spare: a crash, not OOM
        ([RankEnd(1, signal="SIGKILL")], 1, MemoryState(host_fraction=0.5), [(1, "crash")]),
        ([RankEnd(1, exit_code=137)], 1, None, [(1, "crash")]),
        # everyone looks like a consequence: the earliest is named
        (
            [RankEnd(0, t=3.0, error=RESET), RankEnd(1, t=2.0, error="DistBackendError: nccl")],
            None,
            None,
            [(1, "crash"), (0, "consequence")],
        ),
        # torn down by ddptui (SIGTERM) is never the cause
        (
            [RankEnd(0, signal="SIGTERM"), RankEnd(1, t=9.0, error="OSError: disk")],
            0,
            None,
            [(1, "crash"), (0, "consequence")],
        ),
        ([], 0, None, []),
    ],
)
def test_diagnose_crash(ends, launcher, memory, expect):
    out = diagnose_crash(ends, launcher, memory, rss={1: 3 * 1024**3}, t=7.0)
    assert [(d.rank, d.cause) for d in out] == expect


def test_crash_details_carry_the_evidence():
    ends = [
        RankEnd(1, signal="SIGKILL", exit_code=-9),
        RankEnd(0, t=2.0, error=RESET),
    ]
    oom, consequence = diagnose_crash(ends, 1, MemoryState(host_fraction=0.97), {1: 3 * 1024**3})
    assert oom.detail == (
        "rank 1 was killed by SIGKILL while host memory was 97 % used: likely out of memory; "
        "last RSS 3.0 GiB"
    )
    assert consequence.detail.startswith("rank 0 failed after rank 1 (RuntimeError: [../gloo")
    (crash,) = diagnose_crash([RankEnd(2, t=1.0, error="ValueError: x", traceback="Tb...")])
    assert crash.detail == "rank 2 failed first: ValueError: x (traceback in the failure)"


def test_rank_ends_from_the_state():
    state = RunState("r", 3)
    state.apply(protocol.Status(run="r", rank=0, t=0, seq=0, state="failed", error=RESET), 9.0)
    state.apply(protocol.Status(run="r", rank=2, t=0, seq=0, state="started"), 1.0)
    state.set_outcome("failed", RankFailureInfo(rank=2, signal="SIGKILL", exit_code=-9), 10.0)
    ends = {e.rank: e for e in rank_ends(state)}
    assert set(ends) == {0, 2}
    assert ends[0].t == 9.0 and ends[0].error == RESET
    assert ends[2].t is None and ends[2].signal == "SIGKILL" and ends[2].error is None
    out = diagnose_crash(list(ends.values()), state.failure.rank)
    assert [(d.rank, d.cause) for d in out] == [(2, "crash"), (0, "consequence")]


# -- summary.json -----------------------------------------------------------------------------
def test_diagnoses_for_summary_is_plain_json():
    found = [
        Diagnosis(1, "input", "rank 1 straggler: input (…)", 12.34567),
        Diagnosis(None, "hang", "x", float("nan")),
    ]
    doc = diagnoses_for_summary(found, {1: "a" * 30_000, 0: "stack"})
    text = json.dumps(doc, allow_nan=False)
    back = json.loads(text)
    assert back["diagnoses"][0] == {
        "rank": 1,
        "cause": "input",
        "detail": "rank 1 straggler: input (…)",
        "t": 12.346,
    }
    assert back["diagnoses"][1]["t"] is None
    assert list(back["stacks"]) == ["0", "1"] and len(back["stacks"]["1"]) < 20_100
    assert "stacks" not in diagnoses_for_summary([])


# -- the wire ----------------------------------------------------------------------------------
BASE = dict(run="r", rank=0, t=1.0, seq=0)


def test_step_phases_round_trip():
    event = protocol.Step(step=1, phases={"data": 0.1, "augment": 0.02}, **BASE)
    assert protocol.decode_batch(protocol.encode_batch([event])) == [event]
    assert protocol.from_json(protocol.to_json(event)) == event
    old = protocol.from_json(b'{"kind":"step","step":1,"v":1,"run":"r","rank":0,"t":1,"seq":0}')
    assert old.phases is None


@pytest.mark.parametrize(
    "bad",
    [
        {"data": -0.1},
        {"data": float("nan")},
        {"data": 1e400},
        {"": 1.0},
        {"x" * 33: 1.0},
        {f"p{i}": 0.1 for i in range(protocol.MAX_PHASES + 1)},
        {"data": "fast"},
        [0.1, 0.2],
    ],
)
def test_bad_phases_are_rejected_on_the_wire(bad):
    raw = msgspec.msgpack.encode([{"kind": "step", "step": 1, "phases": bad, **BASE}])
    with pytest.raises(protocol.InvalidEvent):
        protocol.decode_batch(raw)


@pytest.mark.parametrize(
    "given, cleaned",
    [
        (None, None),
        ("x", None),
        ({}, None),
        ({"data": 0.5, "forward": 1}, {"data": 0.5, "forward": 1.0}),
        ({"data": -1, "comm": float("nan"), "x": float("inf"), "ok": 0.0}, {"ok": 0.0}),
        ({"data": True, 5: 1.0, "": 1.0, "y": "2"}, {"y": 2.0}),
        ({"n" * 50: 1.0}, {"n" * 32: 1.0}),
        ({f"p{i}": 0.1 for i in range(40)}, {f"p{i}": 0.1 for i in range(16)}),
        # all floats with string names (the hooks' shape), one of them bad
        ({"data": 0.1, "comm": float("nan")}, {"data": 0.1}),
        ({"data": 0.1, "comm": 2e6}, {"data": 0.1}),
        ({"data": 0.1, "": 0.2}, {"data": 0.1}),
        ({"data": 0.1, "n" * 40: 0.2}, {"data": 0.1, "n" * 32: 0.2}),
        ({"data": 0.25, "comm": 0.0}, {"data": 0.25, "comm": 0.0}),
    ],
)
def test_clean_phases(given, cleaned):
    assert protocol.clean_phases(given) == cleaned
    if cleaned:  # what is left always passes the wire's validation
        event = protocol.Step(step=1, phases=cleaned, **BASE)
        protocol.decode_batch(protocol.encode_batch([event]))


def test_the_same_error_raised_by_two_ranks_is_two_failures_not_a_consequence():
    boom = "RuntimeError: injected failure"
    ends = [RankEnd(0, t=1.0, error=boom), RankEnd(1, t=1.2, error=boom)]
    first, second = diagnose_crash(ends, launcher_rank=0)
    assert (first.rank, first.cause) == (0, "crash")
    assert first.detail == f"ranks 0 and 1 failed with the same error: {boom}"
    assert (second.rank, second.cause) == (1, "crash")
    assert "not a consequence" in second.detail and "consequence of" not in second.detail
    assert boom not in second.detail  # named once, in the first line


@pytest.mark.parametrize(
    "error, consequence",
    [
        # DeiT under timm 1.0, both ranks: read as a lost peer's ("TypePeer"), so that
        # rank 1's was "a consequence of rank 0's failure" and rank 0's "no other cause seen"
        ("TypeError: VisionTransformer.__init__() got an unexpected keyword argument 'x'", False),
        ("RuntimeError: runtime output had no rows", False),
        ("RuntimeError: Connection closed by peer [127.0.0.1]:29500", True),
        ("DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970", True),
        ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error", True),
        ("RuntimeError: the peers of this rank went away", True),
        ("RuntimeError: Socket Timeout", True),
        ("torch.distributed.DistStoreError: wait timed out after 30000ms", True),
    ],
)
def test_what_a_lost_peer_causes_is_read_by_whole_words(error, consequence):
    assert RankEnd(1, t=1.0, error=error).consequence_like is consequence


def test_two_ranks_failing_on_the_same_type_error_are_two_failures():
    error = "TypeError: VisionTransformer.__init__() got an unexpected keyword argument 'x'"
    first, second = diagnose_crash([RankEnd(0, t=1.0, error=error), RankEnd(1, t=1.1, error=error)])
    assert first.detail == f"ranks 0 and 1 failed with the same error: {error}"
    assert second.cause == "crash" and "consequence of" not in second.detail
    # rank 1 first (ConvNeXt's ImportError read "ranks 1 and 0"): in order all the same
    first, second = diagnose_crash([RankEnd(0, t=1.2, error=error), RankEnd(1, t=1.1, error=error)])
    assert first.rank == 1 and first.detail == f"ranks 0 and 1 failed with the same error: {error}"
    assert second.detail == (
        "rank 0 failed in its own code with the same error as rank 1 (not a consequence)"
    )


def test_ranks_reporting_one_error_that_reads_like_a_lost_peers_name_no_cause():
    """rasbt/LLMs-from-scratch's DDP script asks for NCCL on a host without CUDA: both ranks
    raised "nccl2 requires at least one CUDA device" (``nccl`` reads like a lost peer's), and
    rank 1's read "a consequence of rank 0's failure", rank 0 "failed first"."""
    error = "RuntimeError: nccl2 requires at least one CUDA device"
    ends = [RankEnd(0, t=1.0, error=error), RankEnd(1, t=1.1, error=error)]
    assert all(end.consequence_like for end in ends)
    first, second = diagnose_crash(ends, launcher_rank=0)
    assert (first.rank, first.cause) == (0, "crash")
    assert first.detail == f"ranks 0 and 1 failed with the same error: {error}"
    assert (second.rank, second.cause, second.detail) == (
        1,
        "crash",
        "rank 1 failed with the same error as rank 0",
    )
    # different words, or a rank killed: the earliest stays the cause, the rest consequences
    lost = "RuntimeError: Connection closed by peer [127.0.0.1]:29500"
    for other in (RankEnd(1, t=1.1, error=lost), RankEnd(1, signal="SIGKILL", error=error)):
        causes = [d.cause for d in diagnose_crash([ends[0], other], launcher_rank=0)]
        assert "consequence" in causes
    # three ranks, two alike and one not: no "same error" line
    third = RankEnd(2, t=1.2, error=lost)
    assert not any("same error" in d.detail for d in diagnose_crash([*ends, third]))


def _reraised(error, where):
    """The error a rank reports for ``error`` raised in a DataLoader worker: torch's own
    re-raise of it in the main process (``ExceptionWrapper``)."""
    from torch._utils import ExceptionWrapper

    try:
        raise error
    except Exception:
        wrapper = ExceptionWrapper(where=where)
    try:
        wrapper.reraise()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    raise AssertionError("not re-raised")


def test_an_error_from_a_dataloader_worker_is_named_by_the_workers_own():
    """DeiT's RandAugment under a newer Pillow: the diagnosis read "rank 0 failed first:
    ValueError: Caught ValueError in DataLoader worker process 0." and no more."""
    from ddptui.formatting import error_head

    text = _reraised(ValueError("bits must be between 1 and 8"), "in DataLoader worker process 0")
    assert text.startswith("ValueError: Caught ValueError in DataLoader worker process 0.")
    head = "ValueError: bits must be between 1 and 8 (in DataLoader worker process 0)"
    assert error_head(text) == (head, True)
    (first,) = diagnose_crash([RankEnd(0, t=1.0, error=text)])
    assert first.detail == f"rank 0 failed first: {head}"
    # a KeyError's message is its repr; an error of several lines: its first
    text = _reraised(KeyError("label"), "in pin memory thread for device 0")
    assert error_head(text)[0] == "KeyError: 'label' (in pin memory thread for device 0)"
    text = _reraised(RuntimeError("bad\nadvice"), "in DataLoader worker process 3")
    assert error_head(text)[0] == "RuntimeError: bad (in DataLoader worker process 3)"
    # not torch's wrapper: as it is
    assert error_head("ValueError: Caught ValueError in my code.\nmore")[0] == (
        "ValueError: Caught ValueError in my code."
    )


FRAME = ('  File "/x/t.py", line 3, in f', "    raise")


@pytest.mark.parametrize(
    "tail, raised",
    [
        ((*FRAME, "RuntimeError: nccl2 requires one"), "RuntimeError: nccl2 requires one"),
        (
            (*FRAME, "torch.distributed.DistNetworkError: in use"),
            "torch.distributed.DistNetworkError: in use",
        ),
        ((*FRAME, "KeyboardInterrupt"), "KeyboardInterrupt"),
        ((*FRAME, "a.b.ProcessRaisedException:"), "a.b.ProcessRaisedException:"),
        # torch's prefix on a rank's uncaught error (open_clip's run under torchrun)
        (tuple(f"[rank1]:{line}" for line in (*FRAME, "ValueError: x")), "ValueError: x"),
        ((*FRAME, "ValueError: " + "é" * 400), "ValueError: " + "é" * 288),
        # not a traceback's end: a print after it, an indented line, no frame, nothing
        ((*FRAME, "RuntimeError: x", "done"), None),
        ((*FRAME, "Epoch: 3"), None),
        ((*FRAME, "loss: 0.2"), None),
        ((*FRAME, "  RuntimeError: x"), None),
        (("RuntimeError: x",), None),
        (("Traceback (most recent call last):", "RuntimeError: x"), None),
        ((), None),
    ],
)
def test_the_error_a_log_ends_with(tail, raised):
    from ddptui.formatting import raised_in

    assert raised_in(tail) == raised


def test_an_error_is_named_by_its_first_line_not_the_advice_after_it():
    """torch's messages go on after what went wrong (``torch.load``'s ends "Check the
    documentation of torch.load…"): two different errors with the same advice are two, and
    the one line names the type and the fault (facebookresearch/vicreg's ranks read "failed
    with the same error: Check the documentation …")."""
    advice = "\n\tWhat to try.\n\nCheck the documentation of torch.load to learn more."
    load = "UnpicklingError: Weights only load failed." + advice
    other = "RuntimeError: something else failed." + advice
    first, second = diagnose_crash([RankEnd(0, t=1.0, error=load), RankEnd(1, t=1.2, error=other)])
    assert first.detail == "rank 0 failed first: UnpicklingError: Weights only load failed."
    assert second.detail.endswith("(not a consequence): RuntimeError: something else failed.")
    first, _ = diagnose_crash([RankEnd(0, t=1.0, error=load), RankEnd(1, t=1.2, error=load)])
    assert first.detail.endswith("the same error: UnpicklingError: Weights only load failed.")
    traced = RankEnd(0, t=1.0, traceback="Traceback (most recent call last):\nKeyError: 'x'\n")
    assert diagnose_crash([traced])[0].detail.startswith("rank 0 failed first: KeyError: 'x'")


def test_only_a_lost_peer_error_is_a_consequence_and_another_own_error_is_its_own():
    ends = [
        RankEnd(0, t=1.0, error="ValueError: bad batch"),
        RankEnd(1, t=1.1, error="KeyError: 'x'"),
        RankEnd(2, t=1.3, error=RESET),
    ]
    out = diagnose_crash(ends, launcher_rank=0)
    assert [(d.rank, d.cause) for d in out] == [(0, "crash"), (1, "crash"), (2, "consequence")]
    assert out[1].detail == "rank 1 also failed on its own (not a consequence): KeyError: 'x'"


def test_after_a_desync_every_failure_is_its_consequence_the_first_included():
    """gloo aborts the rank that receives more bytes than it expects, often the innocent one:
    once the traces name the desync, no failed rank is blamed as the cause."""
    ends = [
        RankEnd(0, signal="SIGABRT", exit_code=-6),
        RankEnd(1, t=1.1, error=RESET),
    ]
    out = diagnose_crash(ends, launcher_rank=0, desync=(1, "all_reduce #17"))
    assert [(d.rank, d.cause) for d in out] == [(0, "consequence"), (1, "consequence")]
    assert out[0].detail == (
        "rank 0 failed (killed by SIGABRT) after rank 1's desync in all_reduce #17: a "
        "consequence, not a cause"
    )
    assert out[1].detail.startswith("rank 1 failed (") and "after its own desync" in out[1].detail
    assert [d.cause for d in diagnose_crash(ends, launcher_rank=0)][0] == "crash"  # without
    placed = [RankEnd(0, error="node 0 (host a)", signal="SIGABRT"), ends[1]]  # multi-node
    assert "(killed by SIGABRT)" in diagnose_crash(placed, 0, desync=(1, "x #1"))[0].detail


@pytest.mark.parametrize(
    "culprit_phases",
    [
        # two healthy ranks on busy shared cores: 14 points less comm, a bit more compute
        phases(forward=0.40, backward=0.37, comm=0.23),
        # much less comm, but no more work of its own in the step (an evaluation pass)
        phases(forward=0.30, backward=0.33, comm=0.05, eval=0.32),
    ],
)
def test_scheduling_noise_is_no_straggler(culprit_phases):
    victim = phases(forward=0.30, backward=0.33, comm=0.37)
    state = live_state({0: victim, 1: culprit_phases})
    found = find_straggler(state.phase_history)
    assert found is None or (found.rank, found.cause) == (None, "communication")


def test_median_shares_follow_the_sliding_window():
    """The medians kept as steps come and go equal the medians of the window's shares, odd
    and even windows, with repeated values, as old steps leave."""
    import random
    import statistics

    from ddptui.constants import PHASES

    rng = random.Random(7)
    for size in (4, 5):
        h = PhaseHistory(window=size)
        shown = []
        for _ in range(23):
            phases = {p: rng.choice((0.1, 0.2, rng.random())) for p in PHASES}
            h.add(3, phases)
            total = sum(phases.values())
            shown = (shown + [{p: v / total for p, v in phases.items()}])[-size:]
            expected = {p: statistics.median(s[p] for s in shown) for p in PHASES}
            assert h.median_shares(3) == expected
    assert PhaseHistory(window=0).median_shares(0) == dict.fromkeys(PHASES, 0.0)


def test_a_reader_that_accepts_old_medians_takes_the_last_ones_computed_within_its_bound():
    """The phase bars accept medians up to a second old: those the straggler rule computed a
    moment before, not a sort of every rank's window again; a strict reader (the straggler
    rule) always gets the window as it is, and an old enough cache is computed anew."""
    from ddptui.constants import PHASES

    now = [100.0]
    h = PhaseHistory(window=3, clock=lambda: now[0])
    h.add(0, {"forward": 1.0})
    first = h.median_shares(0)
    assert first["forward"] == 1.0
    now[0] += 0.5
    h.add(0, {"backward": 1.0})
    h.add(0, {"backward": 1.0})
    assert h.median_shares(0, max_age=1.0) == first  # computed 0.5 s ago: good enough
    assert h.median_shares(0)["backward"] == 1.0  # strict: the window as it is
    now[0] += 0.2
    h.add(0, {"comm": 1.0})
    assert h.median_shares(0, max_age=1.0)["backward"] == 1.0  # 0.2 s old
    now[0] += 2.0
    assert h.median_shares(0, max_age=1.0) == {**dict.fromkeys(PHASES, 0.0), "backward": 1.0}
    assert h.median_shares(0, max_age=1.0) == h.median_shares(0)


def test_a_finding_that_comes_again_is_shown_once_as_last_found():
    from ddptui.run.diagnosis import shown_details

    found = [
        (None, "communication", "communication-bound: 35 %"),
        (2, "compute", "rank 2 computes more"),
        (None, "hang", "ranks 0, 1 stood still"),
        (None, "communication", "communication-bound: 33 %"),
        (None, "hang", "Flight Recorder: traces of ranks 0, 1"),
    ]
    assert shown_details(found) == [
        "rank 2 computes more",
        "ranks 0, 1 stood still",
        "communication-bound: 33 %",
        "Flight Recorder: traces of ranks 0, 1",
    ]


def _stepping_with_progress(world, steps, advances, marks=True, every=10, never=False):
    """A run of ``world`` ranks making ``steps`` steps, a beat every ``every`` steps; each beat
    carries its Flight Recorder progress (``marks``), the default group's last collective
    started moving with the steps (``advances``) or standing at 2 (one all_reduce once), or
    (``never``) no collective started at all in the group."""
    state = announced(world)
    diagnoser = Diagnoser()
    found = []
    seq = dict.fromkeys(range(world), 0)
    for step in range(1, steps + 1):
        for rank in range(world):
            seq[rank] += 1
            state.apply(
                protocol.Step(run="r", rank=rank, t=0.0, seq=seq[rank], step=step, step_time=0.1),
                now=step * 0.1,
            )
            if step % every == 0:
                started = step if advances else 2
                collectives = (
                    [protocol.CollectiveMark(pg="0", op="all_reduce", started=started,
                                             completed=started, backend="gloo")]
                    if marks
                    else []
                )  # fmt: skip
                if never:
                    collectives = [protocol.CollectiveMark(pg="default_pg")]
                state.apply(
                    protocol.Beat(
                        run="r", rank=rank, t=0.0, seq=seq[rank], steps=step,
                        collectives=collectives,
                    ),
                    now=step * 0.1,
                )  # fmt: skip
        found += diagnoser.check(state, step * 0.1)
    return state, found


def test_ranks_that_train_many_steps_without_any_collective_are_said_to_train_apart():
    """pytorch/examples' ImageNet script makes no DDP module on the CPU: its two ranks each
    trained a model of their own, with one metric all_reduce an epoch, and ddptui said nothing.
    Their beats' Flight Recorder progress stood still while they stepped: a note (no verdict),
    said once, kept in summary.json."""
    from ddptui.run.diagnosis import NO_COMM_STEPS

    state, found = _stepping_with_progress(2, NO_COMM_STEPS + 20, advances=False)
    apart = [d for d in found if d.cause == "no_comm"]
    assert len(apart) == 1 and apart[0].rank == 0
    assert "with no collective at all" in apart[0].detail
    assert "DistributedDataParallel" in apart[0].detail
    assert all(v.steps_without_comm >= NO_COMM_STEPS for v in state.ranks.values())
    assert "no_comm" in CAUSES
    doc = diagnoses_for_summary([apart[0]])["diagnoses"][0]
    assert doc["cause"] == "no_comm"


def test_ranks_whose_group_never_ran_a_collective_are_said_to_train_apart():
    """The tutorial's ``train_dist.py`` (seba-1511/dist_tuto.pth) on a recent torch: its
    gradient averaging skips every ``Parameter`` (``type(param) is torch.Tensor``), so its two
    workers formed a group and never ran a collective; a recorder that holds nothing since
    the group formed says so (a group with no collective started), and after as many steps
    the ranks are said to train apart."""
    from ddptui.run.diagnosis import NO_COMM_STEPS

    state, found = _stepping_with_progress(2, NO_COMM_STEPS + 20, False, never=True)
    assert [d.cause for d in found if d.cause == "no_comm"] == ["no_comm"]
    assert [view.collectives for view in state.ranks.values()] == [
        (("default_pg", None, None, None, None),)
    ] * 2


@pytest.mark.parametrize(
    "world, steps, advances, marks, never",
    [
        (2, 200, True, True, False),  # DDP: a gradient all-reduce every step
        (2, 30, False, True, False),  # too few steps to say (local SGD averages every few)
        (2, 30, False, True, True),  # too few steps, no collective yet
        (2, 200, False, False, False),  # no Flight Recorder progress in the beats: no evidence
        (1, 200, False, True, False),  # one rank has no one to talk to
    ],
)
def test_no_train_apart_note_without_the_evidence(world, steps, advances, marks, never):
    _, found = _stepping_with_progress(world, steps, advances, marks, never=never)
    assert [d for d in found if d.cause == "no_comm"] == []


def test_one_rank_alone_without_collectives_is_no_train_apart_note():
    """A rank-0-only probe trained with its own optimizer while the others wait: every rank
    must have stepped apart, not one."""
    from ddptui.run.diagnosis import NO_COMM_STEPS

    state, _ = _stepping_with_progress(2, NO_COMM_STEPS + 20, advances=True)
    state.ranks[0].steps_without_comm = NO_COMM_STEPS + 5
    assert Diagnoser().check(state, 100.0) == []


def test_ranks_that_pass_tensors_point_to_point_are_no_train_apart_note():
    """A pipeline's stages pass activations with isend/irecv every step, which gloo's Flight
    Recorder records nowhere: a rank's ``p2p`` note keeps the ranks from being said apart."""
    from ddptui.run.diagnosis import NO_COMM_STEPS

    state, _ = _stepping_with_progress(2, NO_COMM_STEPS + 20, advances=True)
    for view in state.ranks.values():
        view.steps_without_comm = NO_COMM_STEPS + 5
    note = protocol.Note(run="r", rank=1, t=0.0, seq=999, code="p2p")
    assert no_comm_diagnosis(state, 1.0) is not None
    state.apply(note, now=9.0)
    assert no_comm_diagnosis(state, 1.0) is None
    assert Diagnoser().check(state, 100.0) == []  # the note itself is no line either


def test_the_record_growth_is_read_over_a_full_window_and_said_with_the_disk_left():
    """events.jsonl's growth, read from its size once a second: nothing until the window is
    watched (a first burst is no pace), then bytes a second over the last window only."""
    watch = GrowthWatch(window=30.0)
    sizes = [0] + [700_000 * i for i in range(1, 40)]  # 0.7 MB a second
    rates = [watch.sample(float(t), size) for t, size in enumerate(sizes)]
    assert rates[:27] == [None] * 27
    assert rates[30] == pytest.approx(700_000)
    assert rates[30] > GROWTH_NOTE_BYTES_S
    slow = GrowthWatch(window=30.0)  # a burst, then nothing: the pace of the last 30 s
    for t in range(60):
        rate = slow.sample(float(t), 50_000_000 if t >= 5 else 0)
    assert rate == 0.0
    note = growth_diagnosis(700_000, 100 * 2**30, 31.0)
    assert note.cause == "record_growth" and note.rank is None and "record_growth" in CAUSES
    assert "0.7 MiB a second (2.3 GiB an hour" in note.detail
    assert "100.0 GiB free under the run directory: about 42.6 h" in note.detail
    assert "free" not in growth_diagnosis(700_000, None, 31.0).detail
    assert diagnoses_for_summary([note])["diagnoses"][0]["cause"] == "record_growth"


def test_instrumentation_turned_off_is_a_diagnosis_of_the_rank():
    """The rank's log said it; the run showed 1 step of 32 and finished as if that were all
    (stylegan2-ada-pytorch, before its frozen modules were understood)."""
    state = RunState("r", 2)
    for rank in (1, 0):
        state.apply(protocol.Status(run="r", rank=rank, t=0.0, seq=0, state="started"), now=1.0)
        state.apply(protocol.Note(run="r", rank=rank, t=3.0, seq=1, code="instrument_off"),
                    now=2.0)  # fmt: skip
    diagnoser = Diagnoser()
    found = diagnoser.notes(state)
    assert [(d.rank, d.cause) for d in found] == [(1, "instrumentation")]
    assert found[0].detail.startswith(
        "rank 1: ddptui's step instrumentation turned itself off after an internal error"
    )
    assert diagnoser.notes(state) == []  # said once


def test_gradients_fsdp_sums_over_the_ranks_say_why_each_loss_is_shown_times_them():
    """torchtitan: FSDP's gradient divide factor 1, each rank's loss its share of the run's;
    the ranks report theirs times 2, and the note says so once (no verdict)."""
    state = RunState("r", 2)
    for rank in (0, 1):
        state.apply(protocol.Status(run="r", rank=rank, t=0.0, seq=0, state="started"), now=1.0)
        state.apply(protocol.Note(run="r", rank=rank, t=3.0, seq=1, code="summed_loss",
                                  group_size=2), now=2.0)  # fmt: skip
    diagnoser = Diagnoser()
    (found,) = diagnoser.notes(state)
    assert (found.rank, found.cause) == (0, "summed_loss") and "summed_loss" in CAUSES
    assert found.detail == (
        "each rank's loss is shown times 2: FSDP sums the gradients over 2 ranks "
        "(set_gradient_divide_factor(1.0)), so the script made a rank's loss its share of "
        "theirs (divided by all the ranks' tokens or samples); the ranks' mean is the "
        "script's loss"
    )
    assert diagnoser.notes(state) == []  # said once


def test_a_pass_waiting_for_its_loaders_workers_again_is_a_note_of_the_rank():
    """ijepa: 26 s for its 2 spawned workers at each pass of 5 s (no verdict)."""
    state = RunState("r", 2)
    state.apply(protocol.Status(run="r", rank=0, t=0.0, seq=0, state="started"), now=1.0)
    note = protocol.Note(
        run="r", rank=0, t=3.0, seq=1, code="loader_restart", workers=2, seconds=26, passes=2
    )
    state.apply(note, now=2.0)
    (found,) = Diagnoser().notes(state)
    assert (found.rank, found.cause) == (0, "loader_restart") and "loader_restart" in CAUSES
    assert found.detail == (
        "rank 0: pass 2 over its training DataLoader waited 26 s for its first batch, its 2 "
        "workers starting again (every pass starts them anew); DataLoader(..., "
        "persistent_workers=True) keeps them between passes"
    )
