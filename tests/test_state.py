import statistics

import msgspec
import pytest

from ddptui import protocol
from ddptui.formatting import fmt_eta, fmt_per_s
from ddptui.headless import progress_line
from ddptui.run.state import _RATE_RESUM, RankFailureInfo, RunState
from ddptui.tui.model import run_frame


def ev(cls, rank=0, seq=0, t=0.0, **fields):
    return cls(run="r", rank=rank, seq=seq, t=t, **fields)


def step(rank, seq, step_no, t, epoch=1, loss=1.0, samples=10, step_time=0.1, sps=100.0):
    return ev(
        protocol.Step,
        rank,
        seq,
        t,
        step=step_no,
        epoch=epoch,
        loss=loss,
        samples=samples,
        step_time=step_time,
        samples_per_s=sps,
    )


def test_status_then_steps_update_rank_view():
    s = RunState("r", 2, epochs=2)
    s.apply(ev(protocol.Status, 0, 0, 0.0, state="started", pid=11, host="h", device="cpu"))
    s.apply(step(0, 1, 1, 0.1, loss=2.0))
    s.apply(step(0, 2, 2, 0.2, loss=1.5))
    v = s.ranks[0]
    assert (v.state, v.pid, v.host, v.step, v.loss, v.samples_total) == (
        "started",
        11,
        "h",
        2,
        1.5,
        20,
    )
    assert list(v.loss_series) == [(1, 2.0), (2, 1.5)]
    assert s.ranks[1].state == "pending"
    assert s.status == "running"


def test_seq_gaps_count_dropped_events():
    s = RunState("r", 1)
    for seq in (0, 1, 5, 6, 9):
        s.apply(step(0, seq, seq, float(seq)))
    assert s.ranks[0].gaps == 5
    assert s.dropped == 5


@pytest.mark.parametrize(
    ("rates", "expected"),
    [({0: 100.0, 1: 50.0}, 150.0), ({0: 100.0}, 100.0), ({}, 0.0)],
)
def test_global_throughput_sums_live_ranks(rates, expected):
    s = RunState("r", 2)
    for rank, rate in rates.items():
        s.apply(ev(protocol.Status, rank, 0, 0.0, state="started"))
        s.apply(step(rank, 1, 1, 0.1, sps=rate))
    assert s.global_samples_per_s() == expected


def stepping(ranks=(0, 1), steps=40, step_time=0.07, samples=32):
    """Ranks that stepped every ``step_time`` s up to t = steps * step_time, as a dashboard
    receives them (applied at arrival)."""
    s = RunState("r", len(ranks))
    for rank in ranks:
        s.apply(ev(protocol.Status, rank, 0, 0.0, state="started"), now=0.0)
    for i in range(1, steps + 1):
        t = i * step_time
        for rank in ranks:
            event = step(rank, i, i, t, samples=samples, step_time=step_time)
            s.apply(msgspec.structs.replace(event, samples_per_s=samples / step_time), now=t)
    return s, steps * step_time


def test_throughput_is_the_latest_rate_while_steps_keep_coming():
    s, last = stepping()
    rate = 2 * 32 / 0.07
    for later in (0.0, 0.2, 1.0, 2.0):  # batched arrival, a refresh between two steps
        assert s.global_samples_per_s(last + later) == pytest.approx(rate)
    assert s.global_samples_per_s() == pytest.approx(rate)  # no clock: the latest


def test_throughput_is_the_rate_of_the_recent_steps_not_of_the_last_one():
    """Millisecond steps whose times swing (1.2 ms CPU steps, comm-bound): each refresh read
    the sum of the ranks' last steps' rates, 3,612 to 23,892 samples/s for 12,300. The rate
    is their samples over their time in the last RATE_WINDOW_S."""
    s = RunState("r", 2)
    times = [0.0006, 0.0016, 0.0009, 0.0021, 0.0005, 0.0013] * 100  # 0.7 s: in the window
    t = 0.0
    for rank in (0, 1):
        s.apply(ev(protocol.Status, rank, 0, 0.0, state="started"), now=0.0)
    for i, step_time in enumerate(times, start=1):
        t += step_time
        for rank in (0, 1):
            event = step(rank, i, i, t, samples=8, step_time=step_time)
            s.apply(msgspec.structs.replace(event, samples_per_s=8 / step_time), now=t)
    true_rate = 2 * 8 * len(times) / sum(times)  # every step is in the window
    assert s.global_samples_per_s(t) == pytest.approx(true_rate)
    assert s.ranks[0].samples_per_s == pytest.approx(8 / 0.0013)  # the last step's own
    frame = run_frame(s, t)
    assert [r.samples_per_s_value for r in frame.rows] == pytest.approx([true_rate / 2] * 2)
    # the step time shown beside it is the mean of the same steps (1.17 ms), not the last's
    assert s.ranks[0].recent_step_time() == pytest.approx(sum(times) / len(times))
    assert [r.step_time for r in frame.rows] == ["1.2 ms", "1.2 ms"]


def test_the_recent_rate_reads_only_the_last_seconds_of_steps():
    """Steps of 10 samples/s, then of 1,000: two seconds on, only the new ones count."""
    s = RunState("r", 1)
    t = 0.0
    for i in range(1, 31):
        t += 0.1 if i <= 20 else 0.2
        rate = 10.0 if i <= 20 else 1000.0
        event = step(0, i, i, t, samples=int(rate * (0.1 if i <= 20 else 0.2)), step_time=0.1)
        s.apply(msgspec.structs.replace(event, samples_per_s=rate), now=t)
    assert s.ranks[0].recent_rate() == pytest.approx(1000.0)  # ten steps in the last 2 s
    window = s.ranks[0].rate_window
    assert len(window) == 10
    for i in range(31, 31 + 2 * _RATE_RESUM):  # sums kept up over many steps stay exact
        t += 0.2
        event = step(0, i, i, t, samples=200, step_time=0.2)
        s.apply(msgspec.structs.replace(event, samples_per_s=1000.0), now=t)
    assert len(window) == 10 and s.ranks[0].recent_rate() == pytest.approx(1000.0, rel=1e-12)
    s.apply(ev(protocol.Status, 0, 0, t, state="started", attempt=1), now=t)  # a restart
    assert not window and s.ranks[0].recent_rate() is None


def test_an_outsized_step_leaves_the_recent_rate_exact_once_it_is_out_of_the_window():
    """A step at the largest rate for the longest time the wire allows (a forged event): once
    it leaves the window, the rate is the steps' that stay, not what rounding left of it."""
    s = RunState("r", 1)
    huge = step(0, 1, 1, 1.0, samples=8, step_time=protocol.MAX_SECONDS, sps=protocol.MAX_RATE)
    s.apply(huge, now=1.0)
    t = 4.0
    for i in range(2, 40):
        t += 0.001
        s.apply(step(0, i, i, t, samples=8, step_time=0.001, sps=8000.0), now=t)
    view = s.ranks[0]
    assert len(view.rate_window) == 38
    assert view.recent_rate() == pytest.approx(8000.0, rel=1e-9)
    assert view.recent_step_time() == pytest.approx(0.001, rel=1e-9)


def test_a_pause_beyond_the_grace_decays_the_throughput_to_what_was_kept_up():
    """nanoGPT's rank 0 evaluates for 20 s (rank 1 waits for it in its next all-reduce): no
    samples are trained, and the figure says so instead of the last step's 914 samples/s."""
    s, last = stepping()
    rate = 2 * 32 / 0.07
    assert s.global_samples_per_s(last + 2.5) == pytest.approx(rate * 0.07 / 0.57)
    paused = s.global_samples_per_s(last + 22.0)
    assert paused == pytest.approx(rate * 0.07 / 20.07) and paused < 4
    frame = run_frame(s, last + 22.0)
    assert [r.samples_per_s for r in frame.rows] == ["1.6", "1.6"]
    assert "3.2 samples/s" in frame.summary
    assert "3.2 samples/s" in progress_line(s, last + 22.0)
    # a step again: the rate is the step's
    for rank in (0, 1):
        event = step(rank, 41, 41, last + 22.0, samples=32, step_time=0.07)
        s.apply(msgspec.structs.replace(event, samples_per_s=32 / 0.07), now=last + 22.0)
    assert s.global_samples_per_s(last + 22.1) == pytest.approx(rate)


def test_the_grace_follows_a_slow_ranks_own_step_time():
    """Steps of 5 s are no pause 10 s after the last one (three of its steps: 15 s)."""
    s, last = stepping(steps=6, step_time=5.0)
    assert s.global_samples_per_s(last + 10.0) == pytest.approx(2 * 32 / 5.0)
    assert s.global_samples_per_s(last + 25.0) < 2 * 32 / 5.0


def test_an_ended_run_shows_its_mean_rates_over_its_steps_not_the_last_or_a_decayed_one():
    """40 steps of 70 ms, then a last step that held a 20 s evaluation (nanoGPT's): its rate
    (1.6 samples/s a rank) says nothing about the run; the mean over the steps does, the
    evaluation's time counted."""
    s, last = stepping()
    for rank in (0, 1):
        event = step(rank, 41, 41, last + 20.0, samples=32, step_time=20.0)
        s.apply(msgspec.structs.replace(event, samples_per_s=32 / 20.0), now=last + 20.0)
        s.apply(ev(protocol.Status, rank, 99, last + 20.0, state="finished"), now=last + 20.0)
    s.finished_at, s.outcome = last + 20.0, "finished"
    frame = run_frame(s, last + 80.0)
    mean = 41 * 32 / (40 * 0.07 + 20.0)  # 57.5 samples/s a rank
    assert [r.samples_per_s for r in frame.rows] == [f"{mean:.0f}"] * 2
    assert s.final_samples_per_s() == pytest.approx(2 * mean)
    assert frame.summary.startswith(f"{2 * mean:,.0f} samples/s over the run")


def test_a_rank_that_ran_out_of_batches_early_trained_in_the_runs_time_not_its_own():
    """Uneven inputs under DDP's Join: rank 0 runs out after 10 steps of 0.1 s, rank 1 goes
    on for 250. 4,160 samples in 25 s is 166 samples/s, not each rank's 160 added (320)."""
    s = RunState("r", 2)
    for rank, steps in ((0, 10), (1, 250)):
        s.apply(ev(protocol.Status, rank, 0, 0.0, state="started"), now=0.0)
        for i in range(1, steps + 1):
            s.apply(step(rank, i, i, i * 0.1, samples=16, sps=160.0), now=i * 0.1)
        s.apply(ev(protocol.Status, rank, steps + 1, steps * 0.1, state="finished"))
    s.finished_at, s.outcome = 25.0, "finished"
    assert [v.rate_over_run() for v in s.ranks.values()] == [pytest.approx(160.0)] * 2
    assert s.final_samples_per_s() == pytest.approx(4160 / 25.0)
    assert run_frame(s, 30.0).summary.startswith("166 samples/s over the run")
    # ranks that step together: the sum of their means, as before
    together, _ = stepping(ranks=(0, 1, 2), steps=20, step_time=0.05, samples=8)
    assert together.final_samples_per_s() == pytest.approx(3 * 8 / 0.05)


def ddp_step(rank, seq, step_no, t, step_time, samples=8, comm=0.02):
    """A step as the hooks send it under DDP: its phases, comm among them."""
    phases = {"forward": 0.05, "backward": step_time - 0.07 - comm, "comm": comm, "other": 0.02}
    event = step(rank, seq, step_no, t, samples=samples, step_time=step_time)
    return msgspec.structs.replace(event, phases=phases)


def test_an_event_of_several_fast_steps_counts_each_of_them():
    """The hooks send a very fast script's steps a few at a time (``steps``): each is a step
    of its epoch and of the run, the step time shown is one step's (the table read 15 ms for
    1 ms steps, the time of an event), and where two ranks
    group their steps differently the run's time is still each step's least over the
    ranks (8 steps of 1 ms: 8 ms, not the 16 ms of both ranks' sums)."""
    s = RunState("r", 2)
    for rank in (0, 1):
        s.apply(ev(protocol.Status, rank, 0, 0.0, state="started"), now=0.0)
    groups = {0: [(1, 1), (4, 3), (8, 4)], 1: [(1, 1), (5, 4), (8, 3)]}  # (last step, steps)
    for rank, events in groups.items():
        for seq, (last, count) in enumerate(events, start=1):
            t = last * 0.001
            event = ddp_step(rank, seq, last, t, 0.001 * count, samples=8 * count, comm=0.0)
            event = msgspec.structs.replace(event, steps=count, samples_per_s=8 / 0.001)
            s.apply(event, now=t)
    view = s.ranks[1]
    assert view.steps_in_epoch == 8 and view.samples_total == 64
    assert view.step_time == pytest.approx(0.001)  # one step's, of the 3 in its last event
    assert list(view.recent_step_times) == pytest.approx([0.001] * 8)  # a step an entry
    assert view.recent_step_time() == pytest.approx(0.001)  # the table's: not 8 ms / 3 events
    assert view.recent_rate() == pytest.approx(8 / 0.001)
    assert s.lockstep_time == pytest.approx(0.008)
    assert s.final_samples_per_s() == pytest.approx(128 / 0.008)


def test_a_step_event_stands_for_one_step_unless_it_says_more():
    line = (
        b'{"kind":"step","v":1,"run":"r","rank":0,"t":1.0,"seq":0,"step":3,"samples":8,'
        b'"step_time":0.5}'
    )
    assert protocol.from_json(line).steps == 1  # as every step event before the field
    for bad in (0, -1, protocol.MAX_STEPS_PER_EVENT + 1, 1.5, "2", True):
        forged = line[:-1] + b',"steps":' + msgspec.json.encode(bad) + b"}"
        with pytest.raises(protocol.InvalidEvent):
            protocol.from_json(forged)


@pytest.mark.parametrize("renumbered", [False, True])
def test_a_ranks_wait_inside_a_step_for_rank_0s_checkpoint_is_no_time_the_run_stepped(
    renumbered,
):
    """torchvision's classification reference, 2 ranks: rank 0 writes its checkpoints between
    epochs; rank 1 begins the next epoch at once and waits 1.0 s in its first all-reduce.
    18 steps of 0.3 s each and 144 samples a rank: 53 samples/s over the run, where rank 1's
    summed steps (7.4 s) made it 39. Steps numbered again (a script's own batch index each
    epoch) are not one step of the run each: the longest rank's time, as before."""
    s = RunState("r", 2)
    for rank in (0, 1):
        s.apply(ev(protocol.Status, rank, 0, 0.0, state="started"), now=0.0)
    seq, t = 0, 0.0
    for n in range(1, 19):
        seq += 1
        t += 0.3
        waits = n in (7, 13)  # each later epoch's first step
        number = (n - 1) % 6 + 1 if renumbered else n
        s.apply(ddp_step(0, seq, number, t, 0.3), now=t)
        s.apply(
            ddp_step(1, seq, number, t, 1.3 if waits else 0.3, comm=1.02 if waits else 0.02),
            now=t,
        )
    assert s.lockstep and s.ranks[1].time_stepping == pytest.approx(18 * 0.3 + 2.0)
    if renumbered:
        assert s.steps_unordered
        assert s.final_samples_per_s() == pytest.approx(288 / (18 * 0.3 + 2.0))
        return
    assert s.lockstep_time == pytest.approx(18 * 0.3)
    assert s.final_samples_per_s() == pytest.approx(288 / (18 * 0.3))
    assert s.samples_per_s_over_run() == pytest.approx(53.3, abs=0.1)
    # Each rank's rate over the run leaves its waits out too: rank 1 read 19 beside rank 0's
    # 27, as if it were the slow one; the rows add up to the header's.
    from ddptui.run.rundir import summarize

    s.finished_at, s.outcome = t, "finished"
    frame = run_frame(s, t + 5.0)
    assert [r.samples_per_s for r in frame.rows] == ["27", "27"]
    assert frame.summary.startswith("53 samples/s over the run")
    summary = summarize(s, "finished")
    assert [r["samples_per_s"] for r in summary["ranks"]] == [pytest.approx(144 / 5.4)] * 2


def test_after_a_restart_the_steps_of_one_number_are_one_step_of_the_new_attempt():
    """Rank 1 was killed after 3 steps, rank 0 had done 5: the second attempt's first step is
    each rank's step 1 of it, not the first attempt's step 4 of one and 6 of the other."""
    from ddptui.run.state import AttemptRecord

    s = RunState("r", 2)
    s.begin_attempt(AttemptRecord(0, 0.0))
    seq = {0: 0, 1: 0}
    for rank, steps in ((0, 5), (1, 3)):
        for n in range(1, steps + 1):
            seq[rank] += 1
            s.apply(ddp_step(rank, seq[rank], n, n * 0.3, 0.3 + 0.01 * rank), now=n * 0.3)
    s.begin_attempt(AttemptRecord(1, 10.0))
    for n in range(1, 5):
        for rank in (0, 1):
            seq[rank] += 1
            event = msgspec.structs.replace(ddp_step(rank, seq[rank], n, 10 + n, 0.2), attempt=1)
            s.apply(event, now=10.0 + n)
    assert s.lockstep and not s.steps_unordered
    assert s.lockstep_time == pytest.approx(5 * 0.3 + 4 * 0.2)


def compiled_run(ranks=(0, 1), phases=True, first=(15.5, 15.6), steps=300, step_time=0.1):
    """A run shaped as nanoGPT under torch.compile was on one H200 (thirtieth session): a
    first step that compiled for 15.5 s (15.6 s on rank 1), then ``steps`` short ones (here
    ``step_time`` each); 64 samples a step and rank."""
    s = RunState("r", len(ranks))
    for rank in ranks:
        s.apply(ev(protocol.Status, rank, 0, 0.0, state="started"), now=0.0)
    t = 0.0
    for n in range(1, steps + 2):
        t += first[0] if n == 1 else step_time
        for rank in ranks:
            took = first[rank % len(first)] if n == 1 else step_time
            if phases:
                event = ddp_step(rank, n, n, t, took, samples=64)
            else:
                event = step(rank, n, n, t, samples=64, step_time=took)
            s.apply(event, now=t)
    return s, t


@pytest.mark.parametrize("phases", [True, False])
def test_a_first_step_that_compiled_is_told_apart_from_the_runs_rate(phases):
    """The run's mean over its steps holds its first step's compilation (981 samples/s where
    nanoGPT ran 4,621 after it): the rate after the first step and that step's seconds go
    beside it, in the end line, the dashboard's header and summary.json. Under DDP the first
    step is the run's least over the ranks (15.5 s); without DDP's phases, the longest rank's
    (15.6 s)."""
    from ddptui.headless import over_run
    from ddptui.run.rundir import summarize

    s, t = compiled_run(phases=phases)
    assert s.lockstep is phases
    first = 15.5 if phases else 15.6
    mean = 2 * 301 * 64 / (first + 300 * 0.1)
    after = 2 * 300 * 64 / (300 * 0.1)
    assert s.final_samples_per_s() == pytest.approx(mean)
    rate, took = s.rate_after_first_step()
    assert rate == pytest.approx(after) and took == pytest.approx(first)
    note = f" ({after:,.0f} after its first step of {first:.1f} s)"
    s.finished_at, s.outcome = t, "finished"
    assert over_run(s) == f" at {mean:,.0f} samples/s over the run{note}"
    assert run_frame(s, t + 1.0).summary.startswith(f"{mean:,.0f} samples/s over the run{note}")
    summary = summarize(s, "finished")
    assert summary["samples_per_s"] == pytest.approx(mean)
    assert summary["samples_per_s_after_first_step"] == pytest.approx(after)
    assert summary["first_step_s"] == pytest.approx(first)
    # each rank's own: its mean over its steps holds its first, the figure after it not
    own_first = {0: 15.5, 1: 15.5 if phases else 15.6}  # under DDP the run's stepping time
    for doc in summary["ranks"]:
        took = own_first[doc["rank"]]
        assert doc["samples_per_s"] == pytest.approx(301 * 64 / (took + 300 * 0.1))
        assert doc["samples_per_s_after_first_step"] == pytest.approx(300 * 64 / (300 * 0.1))


def test_each_attempts_first_step_is_its_warm_up():
    """A restarted run warms up again: its second attempt's first step (3.0 s) is left out of
    the rate after the first step as the first attempt's (2.0 s) is."""
    from ddptui.run.state import AttemptRecord

    s = RunState("r", 2)
    s.begin_attempt(AttemptRecord(0, 0.0))
    seq = {0: 0, 1: 0}
    for attempt, first in ((0, 2.0), (1, 3.0)):
        if attempt:
            s.begin_attempt(AttemptRecord(1, 10.0))
        for n in range(1, 6):
            for rank in (0, 1):
                seq[rank] += 1
                took = first + 0.1 * rank if n == 1 else 0.2
                event = ddp_step(rank, seq[rank], n, 10 * attempt + n, took)
                s.apply(msgspec.structs.replace(event, attempt=attempt), now=10 * attempt + n)
    assert s.lockstep_time == pytest.approx(2.0 + 3.0 + 8 * 0.2)
    rate, took = s.rate_after_first_step()
    assert took == pytest.approx(5.0) and rate == pytest.approx(2 * 8 * 8 / (8 * 0.2))


def test_no_rate_after_the_first_step_of_a_run_that_took_one_or_a_steady_one():
    """One step is no rate after it; a first step like the others changes the mean by less
    than a tenth, a fast one raises it: nothing is added to the line."""
    from ddptui.formatting import fmt_first_step
    from ddptui.run.rundir import summarize

    one, _ = compiled_run(steps=0)
    assert one.rate_after_first_step() is None
    assert fmt_first_step(one.final_samples_per_s(), None) == ""
    summary = summarize(one, "finished")
    assert (summary["samples_per_s_after_first_step"], summary["first_step_s"]) == (None, None)
    assert [doc["samples_per_s_after_first_step"] for doc in summary["ranks"]] == [None, None]
    steady, _ = compiled_run(first=(0.5, 0.5), steps=100)
    mean = steady.final_samples_per_s()
    assert steady.rate_after_first_step()[0] == pytest.approx(1280.0)
    assert mean == pytest.approx(2 * 101 * 64 / 10.5)  # 1,231: within a tenth
    assert fmt_first_step(mean, steady.rate_after_first_step()) == ""
    assert fmt_first_step(100.0, (200.0, 75.0)) == " (200 after its first step of 1m15s)"
    assert fmt_first_step(100.0, (109.0, 5.0)) == ""
    # fastai's distrib.py on CPU, 4 steps of 27-48 s: 3.64 over the run, 4.16 after its first
    # (read "4" and "4" while rates below 10 were whole numbers; "3.6" and "4.2" now)
    assert fmt_first_step(3.64, (4.16, 48.3)) == " (4.2 after its first step of 48.3 s)"
    assert fmt_first_step(3.64, (3.66, 48.3)) == ""
    assert fmt_first_step(100.0, (50.0, 0.01)) == ""  # a first step faster than the others
    # tests/scripts/srun_ranks.py: 3 steps of 2 ms read "after its first step of 0.0 s"
    assert fmt_first_step(7385.0, (8564.0, 0.0021)) == " (8,564 after its first step of 2.1 ms)"
    assert fmt_first_step(100.0, (200.0, 0.99)) == " (200 after its first step of 990.0 ms)"
    assert fmt_first_step(100.0, (200.0, 1.0)) == " (200 after its first step of 1.0 s)"
    assert fmt_first_step(100.0, (float("nan"), 5.0)) == ""


def test_under_ddps_join_the_run_steps_as_long_as_its_last_rank():
    """The Join case with DDP's phases: the steps only rank 1 took are the run's, each its
    own time (the least of one rank)."""
    s = RunState("r", 2)
    for rank, steps in ((0, 10), (1, 250)):
        s.apply(ev(protocol.Status, rank, 0, 0.0, state="started"), now=0.0)
        for i in range(1, steps + 1):
            s.apply(ddp_step(rank, i, i, i * 0.1, 0.1, samples=16), now=i * 0.1)
    assert s.lockstep and s.lockstep_time == pytest.approx(25.0)
    assert s.final_samples_per_s() == pytest.approx(4160 / 25.0)


def test_the_headers_loss_leaves_out_a_rank_that_stopped_stepping_while_the_run_went_on():
    """Rank 0 out of batches under Join after 10 steps (loss 0.5), rank 1 on to step 250
    (loss 0.25): the run's loss is rank 1's, not their mean; the row keeps rank 0's."""
    s = RunState("r", 2)
    for rank, steps, loss in ((0, 10, 0.5), (1, 250, 0.25)):
        s.apply(ev(protocol.Status, rank, 0, 0.0, state="started"), now=0.0)
        for i in range(1, steps + 1):
            s.apply(step(rank, i, i, i * 0.1, loss=loss), now=i * 0.1)
    assert s.mean_loss == 0.25
    frame = run_frame(s, 25.0)
    assert "loss 0.2500" in frame.summary
    assert [r.loss for r in frame.rows] == ["0.5000", "0.2500"]
    # within its grace (2 s here) a rank a step or a few behind still counts
    s.apply(step(0, 11, 11, 23.5, loss=0.75), now=23.5)
    assert s.mean_loss == pytest.approx(0.5)
    # ranks that pause together (an evaluation on every rank) all count, however long
    together, last = stepping(steps=5)
    for rank, loss in ((0, 1.0), (1, 3.0)):
        together.apply(step(rank, 6, 6, last + 30.0, loss=loss), now=last + 30.0 + rank * 0.01)
    assert together.mean_loss == pytest.approx(2.0)


def test_a_rank_whose_steps_say_no_time_ends_with_its_last_rate():
    s = RunState("r", 1)
    s.apply(ev(protocol.Status, 0, 0, 0.0, state="started"), now=0.0)
    event = step(0, 1, 1, 0.1, samples=10, sps=100.0)
    s.apply(msgspec.structs.replace(event, step_time=None), now=0.1)
    assert s.ranks[0].rate_over_run() == 100.0 and s.final_samples_per_s() == 100.0


def test_finished_rank_no_longer_counts_towards_throughput():
    s = RunState("r", 1)
    s.apply(step(0, 0, 1, 0.1, sps=100.0))
    s.apply(ev(protocol.Status, 0, 1, 0.2, state="finished"))
    assert s.global_samples_per_s() == 0.0


def test_eval_from_every_rank_is_counted_once_per_epoch():
    s = RunState("r", 3, epochs=2)
    for rank in range(3):
        s.apply(ev(protocol.Eval, rank, 0, 1.0, epoch=1, accuracy=0.9, loss=0.3, count=11))
    s.apply(ev(protocol.Eval, 0, 1, 2.0, epoch=2, accuracy=0.95, loss=0.2, count=11))
    assert [(p.epoch, p.accuracy) for p in s.eval_history] == [(1, 0.9), (2, 0.95)]
    assert s.last_eval.accuracy == 0.95


def test_an_evaluation_not_all_reduced_is_rank_0s():
    """Lightning's ``self.log("val_loss", …)`` without ``sync_dist``: each rank reports its
    own figure. Rank 0's is the one the script prints and logs, whichever arrives first; a
    figure arriving later from a higher rank changes nothing, nor does a lower rank's from an
    earlier attempt."""
    s = RunState("r", 3, epochs=2)
    s.apply(ev(protocol.Eval, 2, 0, 1.0, epoch=1, loss=0.3))
    s.apply(ev(protocol.Eval, 0, 0, 1.1, epoch=1, loss=0.1))
    s.apply(ev(protocol.Eval, 1, 0, 1.2, epoch=1, loss=0.2))
    assert [(p.loss, p.rank) for p in s.eval_history] == [(0.1, 0)]
    s.apply(ev(protocol.Eval, 2, 1, 2.0, epoch=2, loss=0.05, attempt=1))
    s.apply(ev(protocol.Eval, 0, 1, 2.1, epoch=2, loss=0.5, attempt=0))  # late, old attempt
    assert [(p.loss, p.rank) for p in s.eval_history] == [(0.1, 0), (0.05, 2)]


def test_evaluations_within_an_epoch_are_each_kept_once():
    """Evaluating every N steps (the HF Trainer's ``eval_steps``): each evaluation is a point,
    reported by every rank once; the run's last one is the last of its last epoch."""
    s = RunState("r", 2, epochs=2)
    for acc, t in ((0.5, 1.0), (0.7, 2.0)):  # two evaluations in epoch 1, from both ranks
        for rank in range(2):
            s.apply(ev(protocol.Eval, rank, int(t) * 10 + rank, t, epoch=1, accuracy=acc))
    s.apply(ev(protocol.Eval, 1, 99, 3.0, epoch=2, accuracy=0.8))  # rank 1 alone, say
    s.apply(ev(protocol.Eval, 0, 98, 3.5, epoch=2, accuracy=0.8))
    assert [(p.epoch, p.index, p.accuracy) for p in s.eval_history] == [
        (1, 0, 0.5),
        (1, 1, 0.7),
        (2, 0, 0.8),
    ]
    assert s.last_eval.accuracy == 0.8
    from ddptui.tui.model import chart_data

    assert chart_data(s).accuracy == ([1.0, 1.5, 2.0], [0.5, 0.7, 0.8])


def test_evaluations_kept_are_bounded():
    from ddptui.run.state import MAX_EVALS

    s = RunState("r", 1)
    for i in range(MAX_EVALS + 50):
        s.apply(ev(protocol.Eval, 0, i, float(i), epoch=i % 7, accuracy=i / 1e4))
    assert len(s.evals) == MAX_EVALS


def test_progress_and_eta_from_steps_per_epoch():
    s = RunState("r", 1, epochs=2)
    for i in range(1, 11):
        s.apply(step(0, i, i, float(i)), now=float(i))
    s.apply(ev(protocol.EpochEnd, 0, 11, 10.0, epoch=1, time=10.0, samples=100), now=10.0)
    assert s.steps_per_epoch == 10
    assert s.progress() == pytest.approx(0.5)
    for i in range(11, 16):
        s.apply(step(0, i + 1, i, float(i), epoch=2), now=float(i))
    assert s.progress() == pytest.approx(0.75)
    s.started_at = -30.0  # start-up time is not extrapolated: training began at the step at 1
    assert s.eta(16.0) == pytest.approx(5.0)


def test_progress_and_eta_of_a_script_that_counts_epochs_from_0():
    """Most public scripts count their epochs from 0 (``for epoch in range(epochs):
    sampler.set_epoch(epoch)``; pytorch/examples' ImageNet, ignite's CIFAR-10): the run's
    first step at epoch 0 says so. Its second epoch (epoch 1) is its last. Read as counted from
    1, ignite's CIFAR-10 example said "ETA 8m48s" 11 s before its end."""
    s = RunState("r", 1, epochs=2)
    for i in range(1, 11):
        s.apply(step(0, i, i, float(i), epoch=0), now=float(i))
    assert s.progress() == 0.0  # how many steps an epoch takes: not known yet
    s.apply(ev(protocol.EpochEnd, 0, 11, 10.0, epoch=0, time=10.0, samples=100), now=10.0)
    assert s.steps_per_epoch == 10 and s.progress() == pytest.approx(0.5)
    for i in range(11, 16):
        s.apply(step(0, i + 1, i, float(i), epoch=1), now=float(i))
    assert s.progress() == pytest.approx(0.75)
    assert s.eta(16.0) == pytest.approx(5.0)
    s.apply(ev(protocol.EpochEnd, 0, 17, 16.0, epoch=1, time=6.0, samples=50), now=16.0)
    assert s.progress() == pytest.approx(1.0)


def test_an_eta_that_needs_the_epochs_says_so():
    """A script that does not say how many epochs it runs, started without ``--epochs``: its
    ETA is ``--`` for the whole run (Lightning Fabric's MNIST example, 469 steps). Once it
    steps, the header and the console say why; not before its first step, not with the
    epochs known (the first epoch's length is what is missing then), not once it ended, not
    for steps in no epoch at all, nor before an epoch's length is known: detectron2's
    iteration-based run draws from a loader of no length that never ends a pass (its infinite
    ``TrainingSampler``), epoch 0 to its end, where ``--epochs N`` would give no ETA."""
    for epochs, expected in ((None, "-- (epochs unknown: ddptui --epochs N)"), (2, "--")):
        s = RunState("r", 1, epochs=epochs)
        assert fmt_eta(s, 0.0) == "--"
        if not epochs:  # its loader's batches a pass (with them, 2 epochs give an ETA)
            s.apply(ev(protocol.Note, 0, 0, 0.0, code="loader_steps", steps=469), now=0.0)
        for i in range(1, 4):
            s.apply(step(0, i, i, float(i), epoch=0), now=float(i))
        assert fmt_eta(s, 4.0) == expected
        s.set_outcome("failed", RankFailureInfo(rank=0, exit_code=1), now=5.0)
        assert fmt_eta(s, 6.0) == "--"
    s = RunState("r", 1)  # a loader of no length: no epoch's length known
    for i in range(1, 4):
        s.apply(step(0, i, i, float(i), epoch=0), now=float(i))
    assert fmt_eta(s, 4.0) == "--"
    s = RunState("r", 1)
    s.apply(step(0, 1, 1, 1.0, epoch=0), now=1.0)
    s.set_outcome("finished", None, now=2.0)
    assert fmt_eta(s, 3.0) == "0s"
    # Steps in no epoch (nanoGPT's batches from a memmap): --epochs would not give an ETA.
    for epochs in (None, 5):
        s = RunState("r", 1, epochs=epochs)
        for i in range(1, 4):
            s.apply(step(0, i, i, float(i), epoch=None), now=float(i))
        assert fmt_eta(s, 4.0) == "--"


def test_an_evaluation_in_the_middle_of_an_epoch_does_not_end_it():
    """The HF Trainer's ``eval_steps``: an evaluation every 25 steps of 100-step epochs, each
    closing the reporter's epoch (an ``epoch_end``) though more steps of it follow. Read as
    the epoch's end, progress said the first of two epochs was done after its 25th step (and
    an epoch 25 steps long): the ETA of a run 8 times longer. Once a step follows an end in
    the same epoch, an end says nothing: an epoch is done when its steps go on in the next
    one, and its length is that of an epoch whose next one began."""
    s = RunState("r", 1, epochs=2)
    seq = 0
    for epoch in (0, 1):
        for i in range(1, 101):
            seq += 1
            s.apply(step(0, seq, epoch * 100 + i, 0.0, epoch=epoch), now=float(seq))
            if i % 25 == 0:
                seq += 1
                end = ev(protocol.EpochEnd, 0, seq, 0.0, epoch=epoch, time=1.0, samples=250)
                s.apply(end, now=float(seq))
            if epoch == 0 and i == 26:  # steps on after an end: it was no end
                assert s.progress() == 0.0  # how long an epoch is: not known yet
            if epoch == 0 and i == 50:
                assert s.progress() == 0.0
            if epoch == 1 and i == 50:
                assert s.steps_per_epoch == 100
                assert s.progress() == pytest.approx(0.75)
    assert s.progress() == pytest.approx(1.0)


def loader_steps(steps, rank=0, seq=0):
    return ev(protocol.Note, rank, seq, 0.0, code="loader_steps", steps=steps)


def test_a_training_loaders_steps_give_progress_until_the_run_shows_an_epoch():
    """A script that announces no plan: its rank's training DataLoader says 10 steps an
    epoch (``loader_steps``), so progress and ETA run from the first epoch on (before, none
    until an epoch ended: a one-epoch run never had an ETA). What the run then shows wins: an
    epoch's end, or a step into the next epoch. A second note changes nothing."""
    s = RunState("r", 1, epochs=2)
    s.apply(loader_steps(10), now=0.0)
    for i in range(1, 6):
        s.apply(step(0, i, i, 0.0, epoch=0), now=float(i))
    assert s.steps_per_epoch == 10 and s.progress() == pytest.approx(0.25)
    assert s.eta(5.0) == pytest.approx(4.0 * 0.75 / 0.2)
    s.apply(loader_steps(99, seq=6), now=5.0)
    assert s.steps_per_epoch == 10
    for i in range(6, 13):  # the script breaks off at 12 steps an epoch, say
        s.apply(step(0, i, i, 0.0, epoch=0), now=float(i))
    s.apply(step(0, 13, 13, 0.0, epoch=1), now=13.0)
    assert s.steps_per_epoch == 12


def test_loader_steps_taken_back_leave_no_epoch_length():
    """The rank's steps became the script's own (``ddptui.log``, maybe every 10th step): the
    loader's steps say nothing of them; none taken again."""
    s = RunState("r", 2, epochs=2)
    s.apply(loader_steps(10), now=0.0)
    s.apply(ev(protocol.Note, 0, 1, 0.0, code="loader_steps"), now=1.0)
    assert s.steps_per_epoch is None
    s.apply(loader_steps(10, rank=1), now=2.0)
    assert s.steps_per_epoch is None


def test_an_evaluation_in_the_middle_of_an_epoch_leaves_the_loaders_steps():
    s = RunState("r", 1, epochs=2)
    s.apply(loader_steps(100), now=0.0)
    for i in range(1, 26):
        s.apply(step(0, i, i, 0.0, epoch=0), now=float(i))
    s.apply(ev(protocol.EpochEnd, 0, 26, 0.0, epoch=0, time=1.0, samples=250), now=25.0)
    assert s.steps_per_epoch == 25  # an end: it may be one
    s.apply(step(0, 27, 26, 0.0, epoch=0), now=26.0)  # it was not
    assert s.steps_per_epoch == 100 and s.progress() == pytest.approx(0.13)


@pytest.mark.parametrize(
    ("times", "flagged"),
    [
        ({0: 0.1, 1: 0.1, 2: 0.1}, set()),
        ({0: 0.1, 1: 0.1, 2: 0.5}, {2}),
        ({0: 0.1, 1: 0.12, 2: 0.13}, set()),
        ({0: 0.1, 1: 0.4}, {1}),
    ],
)
def test_stragglers_by_step_time_against_median(times, flagged):
    s = RunState("r", len(times))
    for rank, st in times.items():
        s.apply(ev(protocol.Status, rank, 0, 0.0, state="started"), now=0.0)
        for i in range(5):
            s.apply(step(rank, i + 1, i + 1, 0.0, step_time=st), now=1.0)
    problems = s.health(now=1.5)
    assert set(problems) == flagged
    for rank in flagged:
        assert problems[rank].startswith("straggler")


def test_no_straggler_is_named_from_a_first_step():
    """NVlabs/stylegan2-ada-pytorch, 2 workers: rank 1's first step took 16.7 s, most of it
    waiting in the gradient all-reduce for rank 0 to reach its first, and rank 0's 1.0 s;
    from those two steps alone the console named rank 1 a straggler at 1.9x the median. A
    rank's pace is judged from its third step on."""
    s = RunState("r", 2)
    for rank in (0, 1):
        s.apply(ev(protocol.Status, rank, 0, 0.0, state="started"), now=0.0)
    for n in (1, 2, 3):
        for rank, first in ((0, 1.0), (1, 16.7)):
            s.apply(step(rank, n, n, 0.0, step_time=first if n == 1 else 0.4), now=20.0)
        if n < 3:
            assert s.health(now=20.5) == {}
    s.apply(step(1, 4, 4, 0.0, step_time=16.7), now=21.0)  # slow for good: named
    s.apply(step(1, 5, 5, 0.0, step_time=16.7), now=21.0)
    assert s.health(now=21.5)[1].startswith("straggler")


def test_the_step_time_window_is_of_steps_not_events():
    """A fast script's events each hold several steps (``Step.steps``). Kept one entry an
    event, a 20-step run's window was its two slow first steps (DDP's first iterations) and
    one event of 18: rank 1 read "straggler: step time 7 ms is 1.7x the median 4 ms" where
    both ranks stepped in 1.3-1.5 ms, in lock step (the event times of that run)."""
    s = RunState("r", 2)
    events = {
        0: [(1, 1, 8.70), (17, 16, 23.94), (20, 3, 3.69)],
        1: [(1, 1, 7.11), (2, 1, 8.70), (20, 18, 22.87)],
    }
    for rank, steps in events.items():
        s.apply(ev(protocol.Status, rank, 0, 0.0, state="started"), now=0.0)
        for seq, (number, count, ms) in enumerate(steps, 1):
            event = ev(protocol.Step, rank, seq, 0.0, step=number, steps=count,
                       samples=4 * count, step_time=ms / 1000, samples_per_s=4000.0)  # fmt: skip
            s.apply(event, now=1.0)
    assert s.ranks[1].typical_step_time == pytest.approx(22.87e-3 / 18)
    assert s.ranks[0].typical_step_time == pytest.approx(23.94e-3 / 16)
    assert s.health(now=1.5) == {}


def test_silent_rank_is_flagged_after_several_intervals():
    s = RunState("r", 2)
    for rank in (0, 1):
        s.apply(ev(protocol.Status, rank, 0, 0.0, state="started"), now=0.0)
        s.apply(step(rank, 1, 1, 0.0, step_time=1.0), now=0.0)
    s.apply(step(0, 2, 2, 0.0, step_time=1.0), now=20.0)
    problems = s.health(now=20.0)
    assert list(problems) == [1] and problems[1] == "silent: no event for 20 s"
    assert s.health(now=5.0) == {}
    # its I/O moving by ddptui's own sample (a call that keeps the GIL while it reads): said
    s.io_rates = {1: 3 * 2**20, 0: 10 * 2**20}
    assert s.health(now=20.0)[1] == "silent: no event for 20 s, its I/O moving 3.0 MiB/s"
    s.io_rates = {1: 1000.0}  # a trickle: not work to the hang rule, not said
    assert s.health(now=20.0)[1] == "silent: no event for 20 s"


def test_outcome_marks_failing_rank_and_stops_health_checks():
    s = RunState("r", 2)
    s.apply(ev(protocol.Status, 1, 0, 0.0, state="started"), now=0.0)
    failure = RankFailureInfo(rank=1, signal="SIGKILL", stderr_tail=("x",))
    s.set_outcome("failed", failure, now=3.0)
    assert s.status == "failed" and s.ranks[1].state == "failed"
    assert "rank 1 was killed by signal SIGKILL" in s.ranks[1].error
    assert s.ranks[0].state == "stopped"  # never said it ended: torn down by the launcher
    assert s.health(now=100.0) == {}
    assert s.global_samples_per_s() == 0.0


@pytest.mark.parametrize(
    ("failure", "text"),
    [
        (RankFailureInfo(rank=1, signal="SIGKILL"), "rank 1 was killed by signal SIGKILL"),
        (RankFailureInfo(rank=0, exit_code=3), "rank 0 exited with code 3"),
        (RankFailureInfo(rank=None, exit_code=2), "the launcher exited with code 2"),
        (
            RankFailureInfo(rank=2, exit_code=1, error="ValueError: x"),
            "rank 2 exited with code 1: ValueError: x",
        ),
    ],
)
def test_failure_descriptions(failure, text):
    assert failure.describe() == text


def test_rank_still_starting_gets_a_startup_allowance():
    s = RunState("r", 1)
    s.apply(ev(protocol.Status, 0, 0, 0.0, state="started"), now=0.0)
    assert s.health(now=30.0) == {}
    assert s.health(now=61.0) == {0: "silent: no event for 61 s"}


def test_announced_plan_gives_progress_from_the_first_step():
    s = RunState("r", 1)
    s.apply(ev(protocol.Status, 0, 0, 0.0, state="started", epochs=4), now=0.0)
    s.apply(ev(protocol.Status, 0, 1, 0.0, state="started", steps_per_epoch=10), now=0.0)
    for i in range(1, 6):
        s.apply(step(0, i + 1, i, float(i)), now=float(i))
    assert (s.epochs, s.steps_per_epoch) == (4, 10)
    assert s.progress() == pytest.approx(0.125)
    # Training time counts from the first step, and so does progress: steps 2..5 (0.1 of the
    # run) in the 5 s since step 1, with 0.875 left.
    assert s.eta(6.0) == pytest.approx(5.0 * 0.875 / 0.1)


# Epochs of 10 steps, one step per second from the first step at t=100 (start-up before it
# does not count). ``resumed``: epochs done before this run (--resume); ``done``: steps run.
@pytest.mark.parametrize(
    ("epochs", "resumed", "done", "eta"),
    [
        (4, 0, 1, None),  # one step: no time has passed yet
        (4, 0, 11, 29.0),  # 10 steps (0.25 of the run) in 10 s; 29 steps left
        (4, 0, 21, 19.0),
        (4, 2, 1, None),
        (4, 2, 11, 9.0),  # after --resume from epoch 2: 9 steps left, at 1 step/s
        (4, 2, 16, 4.0),
        (10, 9, 6, 4.0),  # the last epoch of a long run: not "done in no time"
        (4, 3, 10, 0.0),
    ],
)
def test_eta_counts_only_the_progress_made_since_the_first_step(epochs, resumed, done, eta):
    s = RunState("r", 1, epochs=epochs)
    s.apply(ev(protocol.Status, 0, 0, 0.0, state="started", steps_per_epoch=10), now=0.0)
    for i in range(done):
        epoch, step_in_epoch = resumed + 1 + i // 10, i + 1
        s.apply(step(0, i + 1, step_in_epoch, 0.0, epoch=epoch), now=100.0 + i)
    now = 100.0 + done - 1
    assert s.eta(now) == (None if eta is None else pytest.approx(eta))


def test_events_of_ranks_outside_the_world_size_get_no_row():
    s = RunState("r", 2)
    for rank in (2, 7, 10**9, *range(100, 10_100)):
        s.apply(step(rank, 0, 1, 0.0), now=1.0)
        s.apply(ev(protocol.Status, rank, 1, 0.0, state="failed", error="spoof"), now=1.0)
    assert sorted(s.ranks) == [0, 1]
    assert s.events_ignored == 2 * 10_003 and s.events_applied == 0
    assert s.status == "starting" and s.samples_total == 0


def test_a_rank_failure_keeps_the_error_and_traceback_the_rank_reported():
    s = RunState("r", 2)
    s.apply(ev(protocol.Status, 1, 0, 0.0, state="started"), now=0.0)
    s.apply(
        ev(protocol.Status, 1, 1, 0.0, state="failed", error="ValueError: x", traceback="Tb"),
        now=1.0,
    )
    assert (s.ranks[1].error, s.ranks[1].traceback) == ("ValueError: x", "Tb")
    s.set_outcome("failed", RankFailureInfo(rank=1, exit_code=1), now=2.0)
    assert (s.failure.error, s.failure.traceback) == ("ValueError: x", "Tb")
    assert s.failure.describe() == "rank 1 exited with code 1: ValueError: x"
    assert s.failure.describe(short=True) == s.failure.describe()


def test_a_failure_in_short_is_its_errors_head():
    """DeiT's RandAugment failing in a DataLoader worker: the console's ``FAILED:`` line
    printed torch's whole re-raised traceback, then the log's tail printed it again."""
    wrapped = (
        "ValueError: Caught ValueError in DataLoader worker process 0.\n"
        "Original Traceback (most recent call last):\n"
        '  File "/venv/lib/python3.11/site-packages/PIL/ImageOps.py", line 712, in posterize\n'
        "    raise ValueError(msg)\n"
        "ValueError: bits must be between or equal to 1 and 8\n"
    )
    failure = RankFailureInfo(rank=0, exit_code=1, error=wrapped)
    assert failure.describe() == f"rank 0 exited with code 1: {wrapped}"  # whole, for files
    assert failure.describe(short=True) == (
        "rank 0 exited with code 1: ValueError: bits must be between or equal to 1 and 8 "
        "(in DataLoader worker process 0) …"
    )


def test_typical_step_time_follows_the_window():
    """The median is kept between reads, and follows every change of the window (a step,
    a new attempt's cleared window, a direct append)."""
    s = RunState("r", 1)
    view = s.ranks[0]
    assert view.typical_step_time is None
    for i, step_time in enumerate((0.1, 0.3, 0.2)):
        s.apply(protocol.Step(run="r", rank=0, t=float(i), seq=i, step=i + 1, step_time=step_time))
    assert view.typical_step_time == 0.2
    view.recent_step_times.append(0.9)
    assert view.typical_step_time == pytest.approx(0.25)
    view.recent_step_times.clear()
    assert view.typical_step_time is None
    # A full window: each step replaces its oldest value, the length stays the same.
    for i in range(3, 3 + 3 * view.recent_step_times.maxlen):
        s.apply(protocol.Step(run="r", rank=0, t=float(i), seq=i, step=i + 1, step_time=i / 10))
        assert view.typical_step_time == statistics.median(view.recent_step_times)
    s.apply(protocol.Status(run="r", rank=0, t=99.0, seq=0, attempt=1, state="started"))
    assert view.typical_step_time is None


@pytest.mark.parametrize("steps", [0, -1, 10**10, True, 2.5, "10"])
def test_a_loader_steps_note_out_of_bounds_is_refused(steps):
    raw = {"kind": "note", "v": 1, "run": "r", "rank": 0, "t": 0.0, "seq": 1}
    raw.update(code="loader_steps", steps=steps)
    with pytest.raises(protocol.InvalidEvent):
        protocol.decode_batch(msgspec.msgpack.encode([raw]))


@pytest.mark.parametrize(
    ("rate", "shown"),
    [
        (None, "--"),
        (0.0, "0.00"),
        (0.434, "0.43"),
        (0.996, "1.0"),
        (4.16, "4.2"),
        (9.96, "10"),
        (1234.4, "1,234"),
        (float("inf"), "inf"),
        (float("nan"), "nan"),
    ],
)
def test_a_slow_rate_keeps_its_digits(rate, shown):
    """facebookresearch/vicreg on 2 CPU cores: 4 samples a step of 9.2 s, and its rank rows
    read ``0`` samples/s, the header ``1``."""

    assert fmt_per_s(rate) == shown


def test_ranks_that_said_they_finished_read_the_runs_rate_until_the_run_ends():
    """swav, 2 ranks: the console's last line, after both ranks said "finished" and before
    the launcher's word, read ``-- samples/s``; the run's rate over its steps is what the
    summary line then prints."""
    s = RunState("r", 2)
    for rank in (0, 1):
        s.apply(ev(protocol.Status, rank, 0, 0.0, state="started"), now=0.0)
        for i in (1, 2, 3):
            s.apply(step(rank, i, i, 2.0 * i, samples=4, step_time=2.0, sps=2.0), now=2.0 * i)
    assert s.live_samples_per_s(6.5) == pytest.approx(4.0)
    s.apply(ev(protocol.Status, 0, 9, 6.6, state="finished"), now=6.6)
    assert s.live_samples_per_s(6.7) == pytest.approx(2.0)  # rank 1 still steps
    s.apply(ev(protocol.Status, 1, 9, 6.8, state="finished"), now=6.8)
    over_run = s.final_samples_per_s()
    assert over_run > 0
    assert s.live_samples_per_s(7.0) == pytest.approx(over_run)
    assert f"{fmt_per_s(over_run)} samples/s" in progress_line(s, 7.0)
    assert f"{fmt_per_s(over_run)} samples/s" in run_frame(s, 7.0).summary
    # a run whose ranks finished without counting a sample says no rate
    quiet = RunState("q", 1)
    quiet.apply(ev(protocol.Status, 0, 0, 0.0, state="started"), now=0.0)
    quiet.apply(ev(protocol.Status, 0, 1, 1.0, state="finished"), now=1.0)
    assert quiet.live_samples_per_s(1.5) is None


def test_no_rate_is_shown_before_a_rank_has_one():
    """A rank's first step says no rate (one step, no interval): barlowtwins' 9 s steps read
    "0.00 samples/s" until the second; a rate of 0 is a rank that keeps up nothing."""
    s = RunState("r", 2)
    for rank in (0, 1):
        s.apply(ev(protocol.Status, rank, 0, 0.0, state="started"), now=0.0)
        s.apply(step(rank, 1, 1, 9.0, samples=4, step_time=9.0, sps=None), now=9.0)
    assert s.live_samples_per_s(9.5) is None
    assert "-- samples/s" in progress_line(s, 9.5)
    assert "-- samples/s" in run_frame(s, 9.5).summary
    s.apply(step(0, 2, 2, 18.0, samples=4, step_time=9.0, sps=0.44), now=18.0)
    assert s.live_samples_per_s(18.5) == pytest.approx(0.44)
    assert "0.44 samples/s" in progress_line(s, 18.5)
    assert "0.44 samples/s" in run_frame(s, 18.5).summary


def test_a_long_step_reads_in_seconds():
    """vicreg's 9.2 s steps on 2 CPU cores read ``9,230.4 ms`` in the rank rows."""
    s = RunState("r", 2)
    for rank, step_time in ((0, 9.2304), (1, 0.1234)):
        s.apply(ev(protocol.Status, rank, 0, 0.0, state="started"), now=0.0)
        for i in (1, 2):
            s.apply(step(rank, i, i, 10.0 * i, step_time=step_time), now=10.0 * i)
    assert [r.step_time for r in run_frame(s, 21.0).rows] == ["9.23 s", "123.4 ms"]


def test_ranks_that_share_their_batches_count_each_batch_once():
    """pytorch/examples' ``fsdp_tp_example.py`` on 4 ranks: FSDP over 2 of them, tensor
    parallel over the other 2, so each batch is trained on by two ranks; its 144 batches
    read 288 samples, at twice the rate. The ranks' ``data_parallel`` note (the group their
    gradients are synchronized over) makes the run's samples, rates and throughput chart
    count each batch once; each rank's row keeps its own; the diagnosis says it once."""
    from ddptui.run.diagnosis import Diagnoser
    from ddptui.tui.model import chart_data

    s = RunState("r", 4)
    for rank in range(4):
        s.apply(ev(protocol.Status, rank, 0, 0.0, state="started"), now=0.0)
    diagnoser = Diagnoser()
    for i in range(1, 5):
        for rank in range(4):
            s.apply(step(rank, i, i, float(i), samples=8, step_time=1.0, sps=8.0), now=float(i))
    assert (s.samples_total, s.live_samples_per_s(4.0)) == (128, pytest.approx(32.0))
    assert diagnoser.notes(s) == []
    for rank in range(4):
        s.apply(ev(protocol.Note, rank, 10, 4.0, code="data_parallel", group_size=2), now=4.0)
    assert s.data_parallel == 2 and s.batch_scale == 0.5
    assert s.samples_total == 64
    assert s.live_samples_per_s(4.0) == pytest.approx(16.0)
    assert s.global_samples_per_s(4.0) == pytest.approx(16.0)
    assert s.final_samples_per_s() == pytest.approx(16.0)
    assert [v.samples_total for v in s.ranks.values()] == [32] * 4
    assert max(chart_data(s).throughput[1]) == pytest.approx(16.0)
    said = diagnoser.notes(s)
    assert [d.cause for d in said] == ["data_parallel"]
    assert said[0].detail.startswith(
        "each batch is trained on by 2 ranks (tensor, pipeline or context parallel; data "
        "parallel over 2 of 4)"
    )
    assert diagnoser.notes(s) == []
    # a smaller number said later (a pipeline beside the tensor parallel split) wins
    s.apply(ev(protocol.Note, 0, 11, 4.0, code="data_parallel", group_size=1), now=4.0)
    s.apply(ev(protocol.Note, 1, 11, 4.0, code="data_parallel", group_size=2), now=4.0)
    assert s.data_parallel == 1 and s.samples_total == 32
    # the whole world data-parallel (a note that says so, or none): as before
    whole = RunState("r", 2)
    whole.apply(ev(protocol.Note, 0, 0, 0.0, code="data_parallel", group_size=2), now=0.0)
    assert whole.batch_scale == 1.0
