"""The dashboard's pure parts: view models, chart series, log following, recent runs,
restart options, replayed failures. No Textual app is started here."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddptui import protocol
from ddptui.formatting import fmt_rate
from ddptui.run.state import RunState
from ddptui.tui.app import restart_config
from ddptui.tui.machine import recent_runs
from ddptui.tui.model import (
    MIN_BUCKET_S,
    _add_carried,
    amp_label,
    chart_data,
    device_label,
    global_throughput,
    run_frame,
    setup_label,
    thin,
)
from ddptui.tui.sources import ReplaySource
from ddptui.tui.widgets.logs import ALL, LogFollower
from tests.tui_fixtures.fakes import FAILED_RUN, FINISHED_RUN, MID_RUN, RUNS


def _step(rank, step, t, loss=1.0, sps=100.0, step_time=0.01, epoch=1, seq=None):
    return protocol.Step(
        run="r",
        rank=rank,
        t=t,
        seq=step if seq is None else seq,
        step=step,
        epoch=epoch,
        loss=loss,
        samples=8,
        samples_per_s=sps,
        step_time=step_time,
    )


@pytest.mark.parametrize(
    "n, limit, expected_len", [(0, 5, 0), (5, 5, 5), (6, 5, 3), (1000, 240, 200), (1001, 240, 201)]
)
def test_thin_bounds_points_and_keeps_the_last(n, limit, expected_len):
    points = list(range(n))
    kept = thin(points, limit)
    assert len(kept) == expected_len
    if n:
        assert kept[-1] == n - 1 and kept == sorted(kept)


def test_global_throughput_sums_ranks_and_carries_slow_ranks_forward():
    fast = [(t / 4, 100.0) for t in range(0, 17)]  # every 0.25 s for 4 s
    slow = [(0.0, 50.0), (2.0, 60.0), (4.0, 60.0)]  # every 2 s
    xs, ys = global_throughput([fast, slow], start=0.0)
    assert len(xs) == len(ys) == 17
    assert ys[0] == 150.0
    assert ys[4] == 150.0  # the slow rank's 50 carried through its silent buckets
    assert ys[-1] == 160.0
    assert global_throughput([[], []], 0.0) == ([], [])


def paused_run(
    before: int,
    after: int,
    step: float = 0.07,
    pause: float = 20.0,
    samples: int = 32,
    waiter: int | None = None,
) -> RunState:
    """Two ranks stepping every ``step`` s, ``before`` steps, a pause of ``pause`` s (rank 0
    evaluates; nanoGPT), then ``after`` steps. ``waiter``: a rank whose next step holds the
    pause (its wait in the all-reduce for rank 0, whose evaluation is out of its own step),
    every step's phases then saying DDP's lock-step."""
    state = RunState("r", 2)
    for rank in (0, 1):
        status = protocol.Status(run="r", rank=rank, t=0.0, seq=0, state="started")
        state.apply(status, now=0.0)
    state.started_at = 0.0
    t = 0.0
    for i in range(1, before + after + 1):
        paused = i == before + 1
        t += step + (pause if paused else 0.0)
        for rank in (0, 1):
            took = step + (pause if paused and rank == waiter else 0.0)
            phases = None if waiter is None else {"forward": 0.8 * step, "comm": took - 0.8 * step}
            event = protocol.Step(
                run="r",
                rank=rank,
                t=t,
                seq=i,
                step=i,
                samples=samples,
                step_time=took,
                samples_per_s=samples / took,
                phases=phases,
            )
            state.apply(event, now=t)
    return state


@pytest.mark.parametrize("before, after", [(40, 40), (1500, 400)])
def test_the_throughput_chart_draws_a_pause_as_no_throughput(before, after):
    """During a pause (a rank-0 evaluation) the ranks train nothing: the chart says 0 there,
    not the last rate carried through, also when the series are thinned (1,900 steps: the
    step that ended the pause is not among the points kept)."""
    state = paused_run(before, after)
    xs, ys = chart_data(state).throughput
    rate = 2 * 32 / 0.07
    end_before = before * 0.07
    grace = 2.0  # RATE_GRACE_S: 3 steps of 70 ms are less
    inside = [
        y for x, y in zip(xs, ys, strict=True) if end_before + grace + 1 < x < end_before + 20
    ]
    around = [
        y
        for x, y in zip(xs, ys, strict=True)
        if end_before - 1 < x < end_before + grace - 0.5 or end_before + 21 < x < end_before + 22
    ]
    assert inside and all(y == 0.0 for y in inside), inside
    assert around and all(y == pytest.approx(rate) for y in around), around
    assert len(state.ranks[0].pauses) == 1


def test_no_pause_in_a_run_whose_steps_keep_coming_slowly():
    """5 s steps: a 5 s gap between two is no pause (three of its steps are the grace)."""
    state = paused_run(10, 0, step=5.0, pause=0.0)
    assert not state.ranks[0].pauses
    xs, ys = chart_data(state).throughput
    assert all(y == pytest.approx(2 * 32 / 5.0) for y in ys[len(ys) // 10 :])


_rate = st.one_of(
    st.floats(min_value=0.0, max_value=1e6),
    st.sampled_from([0.0, 100.0, math.nan, math.inf]),
)


@given(
    series=st.lists(
        st.lists(st.tuples(st.floats(min_value=-5.0, max_value=60.0), _rate), max_size=40),
        max_size=6,
    ),
    start=st.one_of(st.none(), st.floats(min_value=-5.0, max_value=30.0)),
    max_points=st.sampled_from([1, 3, 17, 240]),
)
def test_global_throughput_is_each_ranks_carried_values_summed_bucket_by_bucket(
    series, start, max_points
):
    """The sum kept as each rank's changes equals the definition, summed bucket by bucket
    (clocks that go back, repeated times, NaN and inf included)."""
    series = [sorted(s) if i % 2 else s for i, s in enumerate(series)]  # most in time order
    xs, ys = global_throughput(series, start, max_points)
    live = [s for s in series if s]
    if not live:
        assert (xs, ys) == ([], [])
        return
    t0 = start if start is not None else min(s[0][0] for s in live)
    span = max(max(s[-1][0] for s in live) - t0, 1e-9)
    buckets = min(max_points, max(1, int(span / MIN_BUCKET_S) + 1))
    expected = [0.0] * buckets
    for points in live:
        _add_carried(expected, points, t0, span / buckets)
    assert len(xs) == len(ys) == buckets
    for got, want in zip(ys, expected, strict=True):
        assert got == pytest.approx(want, rel=1e-9, abs=1e-6, nan_ok=True)


def test_run_frame_formats_ranks_and_flags_problems():
    state = RunState("r", 3, epochs=2)
    for step in range(1, 11):
        state.apply(_step(0, step, step * 0.1), now=step * 0.1)
        state.apply(_step(1, step, step * 0.1, step_time=0.05), now=step * 0.1)
    frame = run_frame(state, now=1.05)
    rows = {row.rank: row for row in frame.rows}
    assert rows[0].epoch_step == "1/10" and rows[0].loss == "1.0000"
    assert rows[0].step_time == "10.0 ms" and rows[0].last_seen == "0.1s ago"
    assert rows[1].problem.startswith("straggler")
    assert rows[2].state == "pending" and rows[2].pid == "--"
    assert frame.status == "running" and frame.epoch == "1/2"


@pytest.mark.parametrize(
    ("loss", "shown"),
    [(-0.0, "0.0000"), (-0.00004, "0.0000"), (0.0, "0.0000"), (-1.5, "-1.5000")],
)
def test_a_loss_that_rounds_to_zero_reads_zero_in_its_row_and_the_header(loss, shown):
    """pytorch/examples' multigpu_torchrun.py: its cross_entropy over one class is -0.0 on
    every step; the rank rows read "-0.0000" beside the header's "loss 0.0000". A negative
    loss that does not round to zero keeps its sign."""
    state = RunState("r", 2)
    for rank in (0, 1):
        state.apply(_step(rank, 1, 0.1, loss=loss), now=0.1)
    frame = run_frame(state, now=0.2)
    assert [row.loss for row in frame.rows] == [shown, shown]
    assert f"loss {shown}" in frame.summary, frame.summary


@pytest.mark.parametrize("later", [0.0, 0.5, 3.0, 30.0])
def test_the_header_rate_is_the_runs_global_rate_whatever_the_ranks_states(later):
    """The frame sums the rates it shows per rank; that sum is the run's global rate: the
    live ranks' rates at ``now`` (a pause decays them), a failed or pending rank's left out."""
    state = RunState("r", 4)
    for step in range(1, 11):
        state.apply(_step(0, step, step * 0.1, sps=100.0), now=step * 0.1)
        state.apply(_step(1, step, step * 0.1, sps=250.0, step_time=0.2), now=step * 0.1)
        state.apply(_step(2, step, step * 0.1, sps=70.0), now=step * 0.1)
    failed = protocol.Status(run="r", rank=2, t=1.0, seq=11, state="failed", error="boom")
    state.apply(failed, now=1.0)
    now = 1.0 + later
    frame = run_frame(state, now)
    expected = state.global_samples_per_s(now)
    assert 0 < expected <= 350.0 * (1 + 1e-12)  # each rank's rate over its recent steps
    assert frame.summary.startswith(fmt_rate(expected, True)), frame.summary


def test_chart_data_means_loss_per_step_and_lists_evals():
    state = RunState("r", 2, epochs=3)
    for step in (1, 2):
        state.apply(_step(0, step, step, loss=1.0 * step, seq=step))
        state.apply(_step(1, step, step, loss=3.0 * step, seq=step))
    state.apply(protocol.Eval(run="r", rank=0, t=3, seq=3, epoch=1, accuracy=0.5, count=10))
    data = chart_data(state)
    assert data.mean_loss == ([1.0, 2.0], [2.0, 4.0])
    assert data.loss_by_rank[1] == ([1.0, 2.0], [3.0, 6.0])
    assert data.accuracy == ([1.0], [0.5]) and data.epochs == 3


def test_the_accuracy_chart_places_evaluations_at_the_epochs_the_header_shows():
    """kubeflow's PyTorch MNIST example, 2 epochs known from its ``--epochs``, its loader's
    passes counted from 0: the lines read ``epoch 1/2 accuracy 0.1020`` and ``epoch 2/2 …``,
    and the chart drew its points at 0 and 1 of an axis from 0 to 2."""
    state = RunState("r", 1, epochs=2)
    for epoch in (0, 1):
        state.apply(_step(0, epoch + 1, epoch + 1, epoch=epoch))
        state.apply(protocol.Eval(run="r", rank=0, t=3, seq=10 + epoch, epoch=epoch, accuracy=0.1))
    assert chart_data(state).accuracy == ([1.0, 2.0], [0.1, 0.1])
    from ddptui.formatting import fmt_epoch

    assert [fmt_epoch(state, e) for e in (0, 1)] == ["1/2", "2/2"]
    unknown = RunState("r", 1)  # no count: the script's own numbers, as the lines show them
    unknown.apply(_step(0, 1, 1, epoch=0))
    unknown.apply(protocol.Eval(run="r", rank=0, t=3, seq=10, epoch=0, accuracy=0.1))
    assert chart_data(unknown).accuracy == ([0.0], [0.1])


def _naive_mean_loss(state: RunState) -> dict[int, float]:
    """The loss chart's mean line by its definition: at each step, the mean over the ranks
    whose series hold that step, each rank's last value there."""
    per_rank = [dict(view.loss_series) for view in state.ranks.values()]
    steps = set().union(*per_rank)
    return {s: sum(v := [d[s] for d in per_rank if s in d]) / len(v) for s in steps}


def _same(a: float, b: float) -> bool:
    return (a != a and b != b) or a == b or abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


@given(
    st.lists(
        st.tuples(
            st.integers(0, 3),  # rank
            st.integers(-2, 3),  # how far its step goes: 0 logs it again, < 0 goes back
            st.one_of(
                st.floats(-1e6, 1e6),
                st.sampled_from([math.nan, math.inf, -math.inf]),
            ),
        ),
        max_size=60,
    )
)
def test_the_mean_loss_line_kept_as_steps_arrive_is_the_mean_over_ranks(moves):
    state = RunState("r", 4)
    steps = [0] * 4
    for seq, (rank, ahead, loss) in enumerate(moves):
        steps[rank] = max(0, steps[rank] + ahead)
        state.apply(_step(rank, steps[rank], float(seq), loss=loss, seq=seq))
    naive = _naive_mean_loss(state)
    xs, ys = chart_data(state, max_points=10_000).mean_loss
    assert xs == sorted(float(s) for s in naive)
    assert all(_same(y, naive[int(x)]) for x, y in zip(xs, ys, strict=True)), (xs, ys, naive)


def test_a_step_logged_again_replaces_the_ranks_value_and_old_steps_are_let_go(monkeypatch):
    state = RunState("r", 2)
    state.apply(_step(0, 1, 1.0, loss=math.inf, seq=0))
    state.apply(_step(1, 1, 1.0, loss=2.0, seq=0))
    assert chart_data(state).mean_loss == ([1.0], [math.inf])
    state.apply(_step(0, 1, 2.0, loss=4.0, seq=1))  # ddptui.log(step=1, ...) once more
    assert chart_data(state).mean_loss == ([1.0], [3.0])
    monkeypatch.setattr("ddptui.run.state.SERIES_LENGTH", 3)
    for step in range(2, 7):
        state.apply(_step(0, step, float(step), loss=float(step), seq=step))
    assert sorted(state.loss_steps) == [4, 5, 6]  # as many steps as a rank's series keeps
    assert chart_data(state).mean_loss == ([4.0, 5.0, 6.0], [4.0, 5.0, 6.0])


def test_chart_data_leaves_the_ranks_own_lines_out_unless_asked():
    state = RunState("r", 2)
    state.apply(_step(0, 1, 1.0, loss=1.0, seq=0))
    assert chart_data(state, per_rank=False).loss_by_rank == {}
    assert chart_data(state).loss_by_rank[0] == ([1.0], [1.0])


def test_log_follower_reads_only_new_complete_lines(tmp_path):
    log = tmp_path / "rank-0.log"
    log.write_text("one\ntwo\npart")
    follower = LogFollower(lambda r: tmp_path / f"rank-{r}.log", keep=3)
    assert follower.poll([0, 1]) == [(0, "one"), (0, "two")]  # rank 1 has no file yet
    assert follower.poll([0]) == []
    with open(log, "a") as f:
        f.write("ial\nthree\nfour\n")
    assert follower.poll([0]) == [(0, "partial"), (0, "three"), (0, "four")]
    assert follower.lines(0) == [(0, "partial"), (0, "three"), (0, "four")]  # bounded to 3
    assert follower.lines(ALL)[-1] == (0, "four")


def test_log_follower_lists_the_folder_once_and_asks_each_path_once(tmp_path, monkeypatch):
    import os

    asked, listed = [], []
    real_listdir = os.listdir
    monkeypatch.setattr(os, "listdir", lambda p: listed.append(p) or real_listdir(p))

    def path_for(rank):
        asked.append(rank)
        return tmp_path / f"rank-{rank}.log"

    follower = LogFollower(path_for)
    (tmp_path / "rank-3.log").write_text("here\n")
    assert follower.poll(range(8)) == [(3, "here")]  # the other 7 logs are on other nodes
    assert len(listed) == 1 and sorted(asked) == list(range(8))
    (tmp_path / "rank-5.log").write_text("late\n")  # a log that appears later is read
    assert follower.poll(range(8)) == [(5, "late")]
    assert len(listed) == 2 and len(asked) == 8  # each path asked for once
    assert LogFollower(lambda r: tmp_path / "absent" / "x.log").poll([0]) == []


def test_a_progress_bar_without_newlines_keeps_one_state_and_shows_its_last(tmp_path):
    """tqdm writing to a file: carriage returns for an hour, the newline at the loop's end.
    The line waiting for its newline stayed whole (megabytes, copied at every poll); now it
    keeps only its latest state, and shows that once the newline comes."""
    from ddptui.tui.widgets.logs import MAX_PARTIAL, _fmt

    log = tmp_path / "rank-0.log"
    log.write_text("start\n")
    follower = LogFollower(lambda r: log)
    assert follower.poll([0]) == [(0, "start")]
    for chunk in range(200):  # each poll reads 55 KB of states, under MAX_READ
        with open(log, "a") as f:
            f.write(
                "".join(
                    f"\r{i:6d}/200000 |{'#' * 40}|" for i in range(chunk * 1000, (chunk + 1) * 1000)
                )
            )
        assert follower.poll([0]) == []
        assert len(follower._partial[0]) < 100  # one state, not all of them
    with open(log, "a") as f:
        f.write(f"\r{'200000/200000 |done|':<56}\nafter\n")  # padded, as tqdm pads
    (last, after) = follower.poll([0])
    assert _fmt(*last).rstrip() == "r0│ 200000/200000 |done|" and after == (0, "after")
    # A line with no newline and no carriage return is shown once it is too long to wait.
    lines = []
    for _ in range(3):  # a chunk a poll: the pane keeps up
        with open(log, "a") as f:
            f.write("x" * MAX_PARTIAL)
        lines += follower.poll([0])
    assert lines and all(len(line) <= 2 * MAX_PARTIAL for _, line in lines)
    assert (
        sum(len(line) for _, line in lines) + len(follower._partial.get(0, b"")) == 3 * MAX_PARTIAL
    )


def test_a_progress_bar_being_redrawn_is_live_until_its_newline(tmp_path):
    from ddptui.tui.widgets.logs import _fmt

    logs = {r: tmp_path / f"rank-{r}.log" for r in (0, 1)}
    for log in logs.values():
        log.write_text("start\n")
    follower = LogFollower(logs.__getitem__)
    follower.poll([0, 1])
    assert follower.live == {}
    with open(logs[0], "a") as f:
        f.write("\r 10%|#    |\r 20%|##   |")
    with open(logs[1], "a") as f:
        f.write("\r 50%|#####|")
    assert follower.poll([0, 1]) == []
    assert {r: _fmt(r, bar) for r, bar in follower.live.items()} == {
        0: "r0│  20%|##   |",
        1: "r1│  50%|#####|",
    }
    with open(logs[0], "a") as f:  # rank 0's bar moves on: it is the newest
        f.write("\r 30%|###  |")
    follower.poll([0, 1])
    assert list(follower.live) == [1, 0]
    with open(logs[0], "a") as f:  # its newline: a line among the others, no longer live
        f.write("\r100%|#####|\n")
    assert [_fmt(r, line) for r, line in follower.poll([0, 1])] == ["r0│ 100%|#####|"]
    assert list(follower.live) == [1]


def test_a_rank_writing_faster_than_the_pane_reads_shows_its_latest_lines(tmp_path):
    """At most MAX_READ a poll: a rank writing more than that between polls left the pane
    ever further behind. Now the pane skips to the latest lines and says what it skipped."""
    from ddptui.tui.widgets.logs import MAX_READ

    log = tmp_path / "rank-0.log"
    log.write_text("first\n")
    follower = LogFollower(lambda r: log)
    assert follower.poll([0]) == [(0, "first")]
    with open(log, "a") as f:
        f.write("".join(f"step {i}\n" for i in range(100_000)))
    new = follower.poll([0])
    skipped = log.stat().st_size - MAX_READ - len("first\n")
    assert new[0] == (0, f"… {skipped:,} bytes written faster than shown: all in rank-0.log")
    assert new[-1] == (0, "step 99999") and all(line.startswith("step ") for _, line in new[1:])
    with open(log, "a") as f:
        f.write("next\n")
    assert follower.poll([0]) == [(0, "next")]  # caught up: nothing skipped


def test_log_follower_starts_near_the_end_of_a_big_file(tmp_path):
    log = tmp_path / "rank-0.log"
    log.write_text("".join(f"line {i}\n" for i in range(100_000)))
    new = LogFollower(lambda r: log).poll([0])
    assert new[-1] == (0, "line 99999") and len(new) < 20_000
    assert all(line.startswith("line ") for _, line in new)  # no half line at the start


def test_recent_runs_are_judged_from_their_files():
    runs = {r.run_id: r for r in recent_runs(RUNS)}
    assert runs["rec-ok"].outcome == "finished"
    assert runs["rec-fail"].outcome == "failed"
    assert runs["rec-mid"].outcome == "interrupted"
    assert runs["rec-ok"].target == "script user_ddp.py" and runs["rec-ok"].world_size == 2
    assert recent_runs(Path("/nonexistent")) == []


def test_replayed_failure_says_which_rank_how_and_shows_stderr():
    source = ReplaySource.load(FAILED_RUN)
    failure = source.state.failure
    assert failure is not None and failure.rank == 1 and failure.exit_code == 1
    assert failure.stderr_tail[-1].endswith("RuntimeError: boom on rank 1")
    assert source.now() == source.state.finished_at


def test_replay_of_a_finished_run_has_its_accuracy():
    source = ReplaySource.load(FINISHED_RUN)
    assert source.state.status == "finished"
    assert source.state.last_eval.accuracy == pytest.approx(0.975)
    # no rank runs any more: the header gives the run's rate over its steps (the ranks'
    # samples over the longest time one stepped), and says so
    summary = run_frame(source.state, source.now()).summary
    views = source.state.ranks.values()
    mean = sum(v.samples_timed for v in views) / max(v.time_stepping for v in views)
    assert all(v.time_stepping > 0 for v in views)
    assert mean > 0 and summary.startswith(f"{mean:,.0f} samples/s over the run"), summary


def test_restart_keeps_options_with_a_new_id_and_directory(tmp_path):
    config = json.loads((MID_RUN / "config.json").read_text())
    config["run_dir"] = str(tmp_path / config["run_id"])
    cfg = restart_config(config)
    assert cfg.run_id != config["run_id"]
    assert Path(cfg.run_dir) == tmp_path / cfg.run_id
    assert cfg.script_args == tuple(config["script_args"]) and cfg.epochs == 3
    named = restart_config({**config, "run_dir": str(tmp_path / "mine")})
    assert Path(named.run_dir).name == "mine-restart2"
    (tmp_path / "mine-restart2").mkdir()
    assert (
        Path(restart_config({**config, "run_dir": named.run_dir}).run_dir).name == "mine-restart3"
    )


# -- the header's account of the run ------------------------------------------------------------
TRAINER = {"trainer": "synthetic", "launcher": "spawn", "backend": "gloo", "world_size": 2}
SCRIPT = {**TRAINER, "script": "train.py", "amp": "off"}


@pytest.mark.parametrize(
    ("config", "devices", "expected"),
    [
        (
            {**TRAINER, "amp": "bf16"},
            ["cuda:0", "cuda:1"],
            "spawn · gloo · amp bf16 · cuda:0,1 · 2 ranks",
        ),
        # A script does its own autocast (or not): ddptui's AMP option says nothing about it.
        (SCRIPT, ["cpu", "cpu"], "spawn · gloo · amp: script's · cpu · 2 ranks"),
        ({**SCRIPT, "amp": "fp16"}, [], "spawn · gloo · amp: script's · 2 ranks"),
        # Before the ranks report, the run's device option (RunConfig.device) if there is one.
        (
            {**TRAINER, "amp": "off", "device": "cpu"},
            [None, "--"],
            "spawn · gloo · amp off · cpu · 2 ranks",
        ),
        ({**TRAINER, "device": "cuda"}, [], "spawn · gloo · amp off · cuda · 2 ranks"),
        ({**TRAINER, "device": "auto"}, [], "spawn · gloo · amp off · device auto · 2 ranks"),
        # What the ranks said wins over the option.
        ({**TRAINER, "device": "auto"}, ["cuda:0"], "spawn · gloo · amp off · cuda:0 · 2 ranks"),
    ],
)
def test_setup_label_says_amp_and_device_as_far_as_known(config, devices, expected):
    assert setup_label(config, devices) == expected


def test_setup_label_counts_the_ranks_the_run_grew_to():
    """One process started (``--world-size 1``) whose two workers are the ranks: the header
    read "1 ranks" beside a table of two."""
    one = {**SCRIPT, "world_size": 1}
    assert setup_label(one, [], ranks=1).endswith(" · 1 rank")
    assert setup_label(one, ["cpu", "cpu"], ranks=2).endswith(" · cpu · 2 ranks")
    assert setup_label(SCRIPT, [], ranks=0).endswith(" · 2 ranks")  # none reported yet


@pytest.mark.parametrize(
    ("devices", "expected"),
    [
        ([f"cuda:{i}" for i in (3, 0, 2, 1, 1)], "cuda:0-3"),
        (["cuda:0", "cuda:2", "cuda:5"], "cuda:0,2,5"),
        ([f"cuda:{i}" for i in range(0, 12, 2)], "cuda:0,2,4,6 +2"),
        (["cpu", "cuda:0"], "cpu,cuda:0"),
        (["cuda:10", "cuda:9", "cuda:8"], "cuda:8-10"),
    ],
)
def test_rank_devices_are_summarised(devices, expected):
    assert device_label({}, devices) == expected


def test_replayed_script_run_header_is_honest():
    source = ReplaySource.load(FAILED_RUN)
    frame = run_frame(source.state, source.now())
    label = setup_label(source.config, [row.device for row in frame.rows])
    assert "amp: script's" in label and "amp off" not in label
    assert amp_label(source.config) == "amp: script's"


def test_a_rows_epoch_is_the_headers_for_a_script_counting_epochs_from_0():
    """torchvision's reference (``set_epoch(0)`` first, 6 epochs): the header read "epoch 2/6"
    beside rows at "1/6" (its epoch 1, sixth step), the row reading as the first of six."""
    from ddptui import protocol
    from ddptui.formatting import fmt_epoch

    state = RunState("r", 1, epochs=6)
    state.apply(protocol.Status(run="r", rank=0, t=0.0, seq=0, state="started"), now=0.0)
    for seq, epoch in enumerate([0] * 6 + [1] * 6, start=1):
        state.apply(protocol.Step(run="r", rank=0, t=0.0, seq=seq, step=seq, epoch=epoch), now=1.0)
    frame = run_frame(state, 2.0)
    assert fmt_epoch(state, 1) == "2/6" and frame.rows[0].epoch_step == "2/6"
    unknown = RunState("r", 1)  # epochs not known: the script's own numbers, as before
    unknown.apply(protocol.Step(run="r", rank=0, t=0.0, seq=1, step=1, epoch=0), now=1.0)
    assert run_frame(unknown, 2.0).rows[0].epoch_step == "0/1"


def test_rank_table_counts_steps_within_the_epoch_and_shows_preparing():
    from ddptui import protocol
    from ddptui.run.state import RunState
    from ddptui.tui.model import run_frame

    state = RunState("r", 2)
    for rank in (0, 1):
        state.apply(
            protocol.Status(run="r", rank=rank, t=0.0, seq=0, state="started", pid=9), now=0.0
        )
    for seq, epoch in enumerate([1, 1, 1, 2, 2], start=1):
        state.apply(protocol.Step(run="r", rank=0, t=0.0, seq=seq, step=seq, epoch=epoch), now=1.0)
    state.apply(
        protocol.Beat(run="r", rank=1, t=0.0, seq=1, frame="build_index (data.py:41)"), now=1.0
    )
    rows = {row.rank: row for row in run_frame(state, 2.0).rows}
    assert rows[0].epoch_step == "2/2" and rows[0].state == "started"
    assert rows[1].state == "preparing" and rows[1].where == "build_index (data.py:41)"


class _RecordingPlot:
    """Records what a chart draws (plotext's calls)."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        return lambda *args, **kwargs: self.calls.append((name, args))


@pytest.mark.parametrize(
    ("evals", "title", "xticks"),
    [
        # the HF Trainer without compute_metrics: eval_loss alone, epochs from accelerate's
        # passes (from 0), two evaluations an epoch (eval_steps)
        ([(0, None, 5.6), (0, None, 5.5), (1, None, 5.4)], "eval loss per epoch: 5.4000", [0, 1]),
        ([(1, 0.5, 0.7), (2, 0.75, 0.4)], "eval accuracy per epoch: 0.7500", [1, 2]),
    ],
)
def test_the_evaluation_chart_draws_a_loss_when_no_accuracy_comes(evals, title, xticks):
    from ddptui.tui.widgets.charts import AccuracyChart

    state = RunState("r", 1)
    for seq, (epoch, accuracy, loss) in enumerate(evals):
        state.apply(
            protocol.Eval(
                run="r", rank=0, seq=seq, t=seq, epoch=epoch, accuracy=accuracy, loss=loss
            )
        )
    plot = _RecordingPlot()

    class Chart(AccuracyChart):
        plt = plot

    chart = Chart()
    assert chart.draw(chart_data(state)) is True
    assert chart._titles[0] == title
    assert ("xticks", (xticks,)) in plot.calls
    drawn = next(args for name, args in plot.calls if name == "scatter")
    assert drawn[0] == ([0.0, 0.5, 1.0] if title.startswith("eval loss") else [1.0, 2.0])


def test_a_chart_title_too_wide_for_its_chart_gives_way_to_a_shorter_one():
    """plotext leaves out a title wider than its plot: at 120 columns the accuracy chart of
    a run with no evaluation (38 columns) showed an empty box with no title at all."""
    from ddptui.tui.widgets.charts import fit_title

    long = "eval accuracy — none reported (ddptui.log_eval(epoch=…, accuracy=…) reports one)"
    titles = (long, "eval accuracy — none reported", "eval accuracy")
    assert fit_title(titles, 120) == long
    assert fit_title(titles, 38) == "eval accuracy — none reported"
    assert fit_title(titles, 29) == "eval accuracy — none reported"  # 29 cells: "—" is one
    assert fit_title(titles, 28) == "eval accuracy"
    assert fit_title(titles, 5) == "eval accuracy"  # the shortest, where none fits


@pytest.mark.parametrize(
    ("values", "limits"),
    [
        ([0.5, 0.75], (0.4, 1.0)),  # fractions: zoomed to the tenth below
        ([0.97, 0.99], (0.9, 1.0)),
        ([0.0, 0.02], (0.0, 1.0)),
        # accelerate's complete_cv_example: 100 * accuracy (drawn in 16.6 down to 1.0)
        ([25.0, 16.6667, 58.3333], (10.0, 100.0)),
        ([66.667, 100.0], (60.0, 100.0)),
        ([1.5], (0.0, 100.0)),
        ([-0.2, 0.5], (-0.3, 1.0)),  # below 0: in view
        ([250.0, 3.0], None),  # no accuracy's range: plotext's own
        ([float("nan")], None),
        ([float("nan"), 0.8], (0.7, 1.0)),
    ],
)
def test_the_accuracy_chart_fits_fractions_and_percentages(values, limits):
    from ddptui.tui.widgets.charts import AccuracyChart, accuracy_limits

    found = accuracy_limits(values)
    assert found == (None if limits is None else pytest.approx(limits))
    if found is not None:
        assert all(found[0] <= v <= found[1] for v in values if v == v)
    state = RunState("r", 1)
    for seq, value in enumerate(values):
        state.apply(protocol.Eval(run="r", rank=0, seq=seq, t=seq, epoch=seq, accuracy=value))
    plot = _RecordingPlot()

    class Chart(AccuracyChart):
        plt = plot

    assert Chart().draw(chart_data(state)) is True
    ylim = [args for name, args in plot.calls if name == "ylim"]
    assert ylim == ([] if limits is None else [pytest.approx(limits)])


def test_replayed_diagnoses_with_odd_ranks_are_read(tmp_path):
    """A summary's diagnoses as a file may hold them: a rank that is no int is none."""
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(FAILED_RUN, run_dir)
    summary_path = run_dir / "summary.json"
    summary = {"outcome": "failed", "exit_code": 1}
    summary["diagnoses"] = [
        {"rank": [1], "cause": "compute", "detail": "old"},
        {"rank": {"a": 1}, "cause": "compute", "detail": "new"},
        {"rank": 3, "cause": "crash", "detail": "rank 3 failed first"},
        "not a diagnosis",
    ]
    summary_path.write_text(json.dumps(summary))
    assert ReplaySource.load(run_dir).diagnoses() == ["new", "rank 3 failed first"]


def test_an_ended_runs_table_shows_each_ranks_mean_step_time_beside_its_mean_rate():
    """nanoGPT's rank 1 waited 5.2 s in its last step for rank 0's final evaluation: the ended
    table read ``5.21 s`` for it (the latest steps' mean) beside rank 0's ``12.4 ms``, under
    the same rate. Ended, a rank's step time is its mean over the run, read as its rate is
    (without the waits for ranks that were not stepping); live, its latest steps' mean."""
    from ddptui import protocol
    from ddptui.tui.model import run_frame

    state = paused_run(99, 1, step=0.005, pause=5.2, samples=4, waiter=1)
    live = {row.rank: row for row in run_frame(state, state.last_event_at).rows}
    assert live[1].shown_step_s > 1.0  # live: its latest steps, the long one among them
    for rank in (0, 1):
        state.apply(protocol.Status(run="r", rank=rank, t=0.0, seq=101, state="finished"), now=6.0)
    state.set_outcome("finished", now=6.0)
    rows = {row.rank: row for row in run_frame(state, 6.0).rows}
    assert rows[0].shown_step_s == pytest.approx(0.005)
    assert rows[1].shown_step_s == pytest.approx(0.005)  # the wait was rank 0's, not its own
    assert rows[0].step_time == rows[1].step_time == "5.0 ms"
    assert rows[0].samples_per_s == rows[1].samples_per_s == "800"
