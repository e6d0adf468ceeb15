"""Headless pieces that need no real run: preflight, console lines."""

import io
import time

import msgspec

from ddptui import protocol
from ddptui.formatting import fmt_epoch
from ddptui.headless import HeadlessConsole, eval_summary, gpu_preflight, progress_line
from ddptui.run.config import build_config
from ddptui.run.launcher import LaunchResult
from ddptui.run.machine import Machine
from ddptui.run.state import RunState
from ddptui.tui.model import run_frame
from tests.fake_nvml import FakeGpu, FakeNvml, GiB


def test_nccl_preflight_warns_about_another_jobs_gpu_memory():
    cfg = build_config({"backend": "nccl", "world_size": "1"}, Machine(1, "", 2))
    nvml = FakeNvml([FakeGpu(uuid="GPU-aaaa", name="NVIDIA H100", processes={4321: 10 * GiB})])
    warnings = gpu_preflight(cfg, nvml)
    assert len(warnings) == 1 and "pid 4321" in warnings[0] and "10.0 GiB" in warnings[0]


def test_gloo_run_skips_the_gpu_preflight():
    cfg = build_config({"backend": "gloo"}, Machine(0, "none", 2))
    assert gpu_preflight(cfg, FakeNvml([FakeGpu(processes={1: GiB})])) == []


def step(rank, seq, epoch, sps=500.0):
    return protocol.Step(
        run="r",
        rank=rank,
        seq=seq,
        t=0.0,
        step=seq,
        epoch=epoch,
        loss=0.25,
        samples=50,
        samples_per_s=sps,
        step_time=0.1,
    )


def test_console_prints_status_and_one_line_per_evaluated_epoch():
    state = RunState("r", 2, epochs=3)
    out = io.StringIO()
    console = HeadlessConsole(out, tty=False)
    events = [
        protocol.Status(
            run="r", rank=0, seq=0, t=0.0, state="started", pid=7, host="h", device="cpu"
        ),
        protocol.Status(
            run="r", rank=1, seq=0, t=0.0, state="started", pid=8, host="h", device="cpu"
        ),
        step(0, 1, 1),
        step(1, 1, 1),
        protocol.Eval(
            run="r", rank=0, seq=2, t=0.0, epoch=1, accuracy=0.9612, loss=0.12, count=1001
        ),
        protocol.Eval(
            run="r", rank=1, seq=2, t=0.0, epoch=1, accuracy=0.9612, loss=0.12, count=1001
        ),
    ]
    for event in events:
        state.apply(event, now=1.0)
    console.on_events(state, events, now=1.0)
    lines = out.getvalue().splitlines()
    assert lines[0] == "rank 0 started: pid 7 on h, device cpu"
    assert lines[2].startswith("epoch 1/3  accuracy 0.9612 (1001 samples)  eval loss 0.1200")
    assert "  1,000 samples/s so far  " in lines[2]  # 2 x 50 samples in 0.1 s
    assert len(lines) == 3  # the eval of rank 1 is the same evaluation: not printed twice
    loss_only = protocol.Eval(run="r", rank=0, seq=3, t=0.0, epoch=2, loss=5.38)
    state.apply(loss_only, now=30.0)  # 29 s after the last step: the rate now has decayed
    console.on_events(state, [loss_only], now=30.0)
    line = out.getvalue().splitlines()[3]
    assert line.startswith("epoch 2/3  eval loss 5.3800  1,000 samples/s so far  "), line
    assert state.global_samples_per_s(30.0) < 10


def test_progress_line_shows_throughput_loss_accuracy_and_problems():
    state = RunState("r", 2, epochs=2)
    state.apply(step(0, 0, 1, sps=1200.0), now=0.0)
    state.apply(step(1, 0, 1, sps=800.0), now=0.0)
    line = progress_line(state, now=1.0)
    assert "epoch 1/2" in line and "2,000 samples/s" in line and "loss 0.2500" in line
    line = progress_line(state, now=10.0)
    assert "rank 0 silent" in line and "rank 1 silent" in line
    # no step for 10 s (0.1 s steps): the rate is what the ranks kept up, not their last
    assert "25 samples/s" in line


def test_a_run_whose_ranks_count_no_samples_shows_no_rate_rather_than_zero():
    """Steps without samples (ddptui.log without samples=, a model fed without a DataLoader
    or DDP): the rate is unknown, not 0 samples/s, in the console and in the dashboard."""
    state = RunState("r", 1)
    # Before any step, nothing is known either way: no "samples not counted" yet.
    state.apply(protocol.Status(run="r", rank=0, seq=0, t=0.0, state="started", pid=7), now=0.0)
    assert "-- samples/s" in run_frame(state, now=0.5).summary
    assert run_frame(state, now=0.5).summary.endswith("  0 samples")
    state.apply(protocol.Step(run="r", rank=0, seq=1, t=0.0, step=1, loss=0.5, samples=0), now=0.0)
    assert not state.samples_counted
    assert "-- samples/s" in progress_line(state, now=1.0)
    assert "-- samples/s" in run_frame(state, now=1.0).summary
    assert "samples not counted" in run_frame(state, now=1.0).summary
    state.apply(step(0, 1, 1, sps=100.0), now=1.0)
    assert state.samples_counted and "100 samples/s" in progress_line(state, now=1.0)


def test_terminal_gets_a_redrawn_progress_bar_and_pipes_get_lines():
    state = RunState("r", 1, epochs=2)
    state.apply(step(0, 0, 1), now=0.0)
    state.apply(
        protocol.EpochEnd(run="r", rank=0, seq=1, t=0.0, epoch=1, time=1.0, samples=50), now=0.5
    )
    tty, pipe = io.StringIO(), io.StringIO()
    HeadlessConsole(tty, tty=True, width=200).tick(state, now=1.0)
    HeadlessConsole(pipe, tty=False).tick(state, now=10.0)
    assert tty.getvalue().startswith("\r\x1b[2K") and "50%" in tty.getvalue()
    assert "█" * 12 + "░" * 12 in tty.getvalue() and not tty.getvalue().endswith("\n")
    assert pipe.getvalue().endswith("\n") and "\r" not in pipe.getvalue()


def test_the_runs_progress_is_printed_at_its_end_where_steps_came_after_the_last_line():
    """rasbt/LLMs-from-scratch's DDP script trained its 6 steps before the first line was due:
    its loss was never shown."""
    state = RunState("r", 1)
    pipe = io.StringIO()
    console = HeadlessConsole(pipe, tty=False)
    console.last_progress(state, now=1.0)
    assert pipe.getvalue() == ""  # no step: nothing to show
    state.apply(step(0, 1, 1), now=1.0)
    console.last_progress(state, now=2.0)
    assert pipe.getvalue().count("\n") == 1 and "loss 0.2500" in pipe.getvalue()
    console.last_progress(state, now=3.0)  # nothing new since: not again
    console.tick(state, now=10.0)
    assert pipe.getvalue().count("\n") == 2
    console.last_progress(state, now=11.0)
    assert pipe.getvalue().count("\n") == 2
    state.apply(step(0, 2, 1), now=11.0)
    console.last_progress(state, now=12.0)
    assert pipe.getvalue().count("\n") == 3
    # on a terminal the bar is cleared at the end: its last state is printed as a line
    tty = io.StringIO()
    console = HeadlessConsole(tty, tty=True, width=200)
    console.tick(state, now=12.0)
    console.last_progress(state, now=12.5)
    assert tty.getvalue().endswith("\n") and "loss 0.2500" in tty.getvalue().rsplit("\r", 1)[-1]


def test_replay_reads_only_the_events_of_the_run_its_config_names(tmp_path):
    import json

    from ddptui.run.rundir import load_run

    (tmp_path / "config.json").write_text(json.dumps({"run_id": "a", "world_size": 1}))
    lines = [
        protocol.to_json(e)
        for e in (
            protocol.Step(run="old", rank=0, seq=0, t=0.0, step=1, samples=999),
            protocol.Step(run="a", rank=0, seq=0, t=100.0, step=1, samples=10),
            protocol.Status(run="a", rank=0, seq=1, t=101.0, state="finished"),
        )
    ]
    (tmp_path / "events.jsonl").write_bytes(b"\n".join(lines) + b"\n{half a line")
    _, state, summary = load_run(tmp_path)
    assert state.samples_total == 10 and state.status == "finished"
    assert state.elapsed(state.last_event_at) == 1.0


def test_progress_bar_never_wraps_the_terminal():
    state = RunState("r", 2, epochs=2)
    state.apply(step(0, 0, 1, sps=1200.0), now=0.0)
    state.apply(step(1, 0, 1, sps=800.0), now=0.0)
    for width in (20, 40, 80):
        out = io.StringIO()
        HeadlessConsole(out, tty=True, width=width).tick(state, now=10.0)
        drawn = out.getvalue().removeprefix("\r\x1b[2K")
        assert 0 < len(drawn) < width and "\n" not in drawn


def test_epoch_zero_is_shown_and_an_unknown_total_is_not_a_question_mark():
    state = RunState("r", 1)
    state.apply(step(0, 0, 0), now=1.0)
    line = progress_line(state, 2.0)
    assert "epoch 0  " in line and "/?" not in line
    state.epochs = 20
    state.apply(step(0, 1, 19), now=3.0)
    # Counted from 0, the script's epoch 19 is the last of 20: "19/20" read as one to go.
    assert "epoch 20/20" in progress_line(state, 4.0)


def test_of_n_epochs_counts_from_one_whatever_the_scripts_numbering():
    """``E/N`` is the E-th of N: a script counting from 0 (ignite's sampler, most loops) ended
    its run showing ``epoch 1/2`` beside 100 %. Counted from 1 (the built-in trainers), the
    numbers are the script's; without N, a lone number stays the script's own."""
    zero = RunState("r", 1)
    zero.apply(step(0, 0, 0), now=1.0)
    assert "epoch 0  " in progress_line(zero, 1.5)  # no N: the script's own number
    zero.epochs = 2
    assert "epoch 1/2  " in progress_line(zero, 2.0)
    zero.apply(step(0, 1, 1), now=3.0)
    assert "epoch 2/2  " in progress_line(zero, 4.0)
    assert run_frame(zero, 4.0).epoch == "2/2"  # the dashboard's header, the same
    out = io.StringIO()
    last = protocol.Eval(run="r", rank=0, seq=2, t=0.0, epoch=1, accuracy=0.8)
    zero.apply(last, now=5.0)
    HeadlessConsole(out, tty=False).on_events(zero, [last], now=5.0)
    assert out.getvalue().startswith("epoch 2/2  accuracy 0.8000"), out.getvalue()
    assert eval_summary(zero, script=True) == "final accuracy 0.8000 (epoch 2/2)"
    one = RunState("r", 1)
    one.epochs = 2
    one.apply(step(0, 0, 1), now=1.0)
    assert "epoch 1/2  " in progress_line(one, 2.0)
    one.apply(step(0, 1, 2), now=3.0)
    assert "epoch 2/2  " in progress_line(one, 4.0)
    assert fmt_epoch(one, None) == "-"
    assert fmt_epoch(RunState("r", 1), 7) == "7"


def test_a_preparing_rank_is_shown_with_its_frame():
    state = RunState("r", 2)
    for rank in (0, 1):
        state.apply(
            protocol.Status(run="r", rank=rank, t=0.0, seq=0, state="started", pid=9), now=0.0
        )
    assert "preparing (2 ranks, rank 0)" in progress_line(state, 0.5)  # no beat yet
    beat = protocol.Beat(run="r", rank=1, t=0.0, seq=1, frame="tokenize (prep.py:12)", cpu=1.0)
    state.apply(beat, now=1.0)
    # the rank seen at work before one not seen yet
    assert "preparing (2 ranks, rank 1 at tokenize (prep.py:12))" in progress_line(state, 2.0)
    state.apply(step(0, 2, 1), now=3.0)
    assert "preparing (rank 1 at tokenize (prep.py:12))" in progress_line(state, 4.0)


def test_a_preparing_line_names_the_rank_the_others_wait_for():
    """ConvNeXt's rank 0, at its process group's rendezvous, read ``preparing (2 ranks, rank 0
    at init_distributed_mode (utils.py:328))``: the rank at work is the one to name, and a
    rank that waits says in what."""
    state = RunState("r", 3)
    for rank in (0, 1, 2):
        state.apply(
            protocol.Status(run="r", rank=rank, t=0.0, seq=0, state="started", pid=9), now=0.0
        )
    for rank, frame, waiting in (
        (0, "main (train.py:40)", "barrier"),
        (1, "download (data.py:9)", None),
        (2, "main (train.py:40)", "barrier"),
    ):
        beat = protocol.Beat(
            run="r", rank=rank, t=0.0, seq=1, frame=frame, waiting=waiting, cpu=1.0
        )
        state.apply(beat, now=1.0)
    assert "preparing (3 ranks, rank 1 at download (data.py:9))" in progress_line(state, 2.0)
    beat = protocol.Beat(
        run="r", rank=1, t=0.0, seq=2, frame="main (train.py:40)", waiting="barrier", cpu=1.0
    )
    state.apply(beat, now=3.0)
    assert "preparing (3 ranks, rank 0 waiting in barrier at main (train.py:40))" in progress_line(
        state, 4.0
    )


def _beat(rank, seq, evaluations, frame="validate (main.py:383)"):
    return protocol.Beat(
        run="r", rank=rank, t=0.0, seq=seq, frame=frame, cpu=1.0, evaluations=evaluations
    )


def test_a_rank_that_only_evaluates_reads_evaluating_not_preparing():
    """pytorch/examples' ImageNet ``main.py --evaluate``: no step at all, evaluation batches
    from the start; it read ``preparing (2 ranks, rank 0 at run_validate (main.py:383))``."""
    state = RunState("r", 2)
    for rank in (0, 1):
        state.apply(
            protocol.Status(run="r", rank=rank, t=0.0, seq=0, state="started", pid=9), now=0.0
        )
    for rank in (0, 1):
        state.apply(_beat(rank, 1, 0, frame="main (main.py:140)"), now=0.5)
    assert "preparing (2 ranks, rank 0 at main (main.py:140))" in progress_line(state, 0.6)
    for rank in (0, 1):
        state.apply(_beat(rank, 1, 12), now=1.5)
    line = progress_line(state, 1.6)
    assert "evaluating (2 ranks, rank 0 at validate (main.py:383))" in line
    assert "preparing" not in line
    # the count stands still (a long forward, a stall): no longer said to evaluate
    state.apply(_beat(1, 1, 12), now=2.5)
    assert "evaluating (rank 0 at validate (main.py:383))" in progress_line(state, 2.6)
    assert "preparing (rank 1 at validate (main.py:383))" in progress_line(state, 2.6)
    assert state.ranks[0].evaluations == 12 and state.ranks[1].activity == "preparing"


def test_an_evaluation_between_steps_reads_evaluating_until_the_next_step():
    state = RunState("r", 2)
    for rank in (0, 1):
        state.apply(
            protocol.Status(run="r", rank=rank, t=0.0, seq=0, state="started", pid=9), now=0.0
        )
    state.apply(_beat(0, 1, 0), now=0.5)
    state.apply(step(0, 1, 1), now=1.0)
    state.apply(step(1, 1, 1), now=1.0)
    # rank 0's count grew, but it stepped since its last beat: training, not (yet) evaluating
    state.apply(_beat(0, 1, 5), now=1.5)
    assert state.ranks[0].activity == "started"
    state.apply(_beat(0, 1, 40), now=2.5)  # no step since the last beat: evaluating
    assert state.ranks[0].activity == "evaluating"
    assert "evaluating (rank 0 at validate (main.py:383))" in progress_line(state, 2.6)
    rows = {row.rank: row for row in run_frame(state, 2.6).rows}
    assert rows[0].state == "evaluating" and rows[0].where == "validate (main.py:383)"
    assert rows[1].state == "started" and rows[1].where == ""
    state.apply(step(0, 2, 1), now=3.0)  # the next step ends it at once
    assert state.ranks[0].activity == "started"
    assert "evaluating" not in progress_line(state, 3.1)
    # a new attempt's process counts from 0 again: its first evaluation batches are seen
    state.apply(
        protocol.Status(run="r", rank=0, t=0.0, seq=0, state="started", pid=10, attempt=1),
        now=4.0,
    )
    assert state.ranks[0].evaluations == 0
    restarted = protocol.Beat(run="r", rank=0, t=0.0, seq=0, cpu=1.0, evaluations=3, attempt=1)
    state.apply(restarted, now=4.5)
    assert state.ranks[0].activity == "evaluating"


def test_no_evaluation_is_said_plainly_with_how_to_add_one():
    state = RunState("r", 1)
    assert eval_summary(state, script=False) == "no evaluation received"
    assert eval_summary(state, script=True) == (
        "the script reports no evaluation (ddptui.log_eval(epoch=…, accuracy=…) adds it)"
    )
    state.apply(
        protocol.Eval(run="r", rank=0, t=0.0, seq=0, epoch=1, accuracy=0.5, count=10), now=1.0
    )
    assert eval_summary(state, script=True) == "final accuracy 0.5000 (epoch 1)"
    # a loss alone (the HF Trainer's eval_loss): said as such, not "final accuracy --"
    state.apply(protocol.Eval(run="r", rank=0, t=0.0, seq=1, epoch=2, loss=5.38), now=2.0)
    assert eval_summary(state, script=True) == "final eval loss 5.3800 (epoch 2)"


def test_the_status_line_shows_an_evaluations_loss_when_it_has_no_accuracy():
    state = RunState("r", 1)
    assert "acc --" in progress_line(state, 1.0)
    state.apply(protocol.Eval(run="r", rank=0, t=0.0, seq=0, epoch=0, loss=5.38), now=1.0)
    assert "  eval loss 5.3800  " in progress_line(state, 1.0)
    state.apply(protocol.Eval(run="r", rank=0, t=0.0, seq=1, epoch=1, accuracy=0.5), now=2.0)
    assert "  acc 0.5000  " in progress_line(state, 2.0)


def test_a_session_says_once_when_its_record_grows_fast(tmp_path, monkeypatch):
    """The session's once-a-second diagnosis reads events.jsonl's size: past the threshold
    over the window it records one ``record_growth`` note (for the front ends and
    summary.json), and never a second."""
    from ddptui.run import session as session_module
    from ddptui.run.diagnosis import GrowthWatch
    from ddptui.run.session import RunSession

    class Growing:  # what the session reads of its LineAppender
        size = 0

    cfg = build_config({"run_dir": str(tmp_path / "run")}, Machine(0, "none", 2))
    session = RunSession(cfg)
    monkeypatch.setattr(session_module, "GROWTH_NOTE_BYTES_S", 1000)
    session._growth = GrowthWatch(window=2.0)
    session._events_file = Growing()
    session.run_dir.mkdir(parents=True, exist_ok=True)
    said = []
    try:
        for second in range(8):
            Growing.size = 5000 * second
            session._watch_growth(float(second))
            said += session.take_diagnoses()
    finally:
        session._events_file = None
        session.close()
    assert [d.cause for d in said] == ["record_growth"]
    assert "free under the run directory" in said[0].detail
    assert [d.cause for d in session.diagnoser.diagnoses] == ["record_growth"]


def test_ddptuis_own_error_is_said_once_and_the_run_goes_on(tmp_path, monkeypatch):
    """An error of ddptui's own in its diagnosis, or in applying one event, left the loop
    that drives the run, and the run was stopped (a monitor's bug ended a healthy run). Now
    each is said once as an ``own_error`` note naming the error and where it was raised; the
    other events still count, and no verdict is tried again after a diagnosis error."""
    from ddptui.run.session import RunSession

    class Feed:  # what the session reads of its Collector
        def __init__(self, batches):
            self.batches = batches

        def poll(self, timeout):
            return self.batches.pop(0) if self.batches else []

        def close(self):
            pass

    def step(n, loss):
        return protocol.Step(run="r", rank=0, t=0.0, seq=n, step=n, loss=loss)

    cfg = build_config({"run_dir": str(tmp_path / "run")}, Machine(0, "none", 2))
    session = RunSession(cfg)
    clock = [100.0]
    session.clock = lambda: clock[0]
    checks = []

    def check(*args, **kwargs):
        checks.append(args)
        raise KeyError("boom")

    monkeypatch.setattr(session.diagnoser, "check", check)
    apply = session.state.apply

    def applied(event, now=None):
        if event.loss == 13.0:
            raise ValueError("an event no check foresaw")
        apply(event, now)

    monkeypatch.setattr(session.state, "apply", applied)
    session.collector = Feed([[step(1, 1.0), step(2, 13.0), step(3, 2.0)], [step(4, 13.0)], []])
    said = []
    try:
        for _ in range(3):
            session.pump(0.0)
            said += session.take_diagnoses()
            clock[0] += 5.0
    finally:
        session.collector = None
        session.close()
    assert session.state.ranks[0].step == 3 and session.state.ranks[0].loss == 2.0
    assert [d.cause for d in said] == ["own_error", "own_error"]
    events, diagnosis = said
    assert "applying an event (ValueError: an event no check foresaw at test_" in events.detail
    assert "kept in events.jsonl" in events.detail
    assert "diagnosing the run (KeyError: 'boom' at test_headless_units.py:" in diagnosis.detail
    assert "no straggler or hang verdict" in diagnosis.detail
    assert len(checks) == 1  # not tried again
    assert session.result is None  # the run was not stopped


def _ended_session(tmp_path, stepped: bool):
    """A session of two ranks that started and finished (with a step each when ``stepped``),
    concluded without a launch."""
    from ddptui.run.launcher import LaunchResult
    from ddptui.run.session import RunSession

    cfg = build_config(
        {"device": "cpu", "world_size": "2", "run_dir": str(tmp_path / "run")}, deep=False
    )
    session = RunSession(cfg, clock=lambda: 100.0)
    session.run_dir.mkdir(parents=True)
    events = [
        protocol.Status(run=cfg.run_id, rank=r, t=1.0, seq=0, state="started") for r in (0, 1)
    ]
    if stepped:
        events += [msgspec.structs.replace(step(r, 1, 1), run=cfg.run_id) for r in (0, 1)]
    events += [
        protocol.Status(run=cfg.run_id, rank=r, t=2.0, seq=2, state="finished") for r in (0, 1)
    ]
    session._record(events)
    session._conclude(LaunchResult(0), drain=False)
    return session


def test_a_run_that_finished_without_a_step_shows_what_its_first_rank_said_last(tmp_path):
    """pytorch/examples' ``ddp/example.py`` on a machine without two GPUs prints why it
    exits and trains nothing: plain torchrun shows the line, and so does the summary."""
    session = _ended_session(tmp_path, stepped=False)
    session.files.rank_log(0).write_text("")  # rank 0 said nothing: the next rank's lines
    lines = [f"line {i}" for i in range(8)]
    session.files.rank_log(1).write_text("\n".join([*lines, "Unable to locate 2 gpus."]) + "\n")
    out = io.StringIO()
    HeadlessConsole(out, tty=False).summary(session, 100.0)
    text = out.getvalue()
    assert text.startswith("run finished without a step after ")
    assert "last lines of rank-1.log:\n  | line 4\n" in text
    assert "  | line 7\n  | Unable to locate 2 gpus.\nrun directory: " in text
    assert "line 3" not in text and "rank-0.log" not in text


def test_a_run_with_steps_or_ranks_without_output_shows_no_log_lines(tmp_path):
    for stepped in (True, False):
        session = _ended_session(tmp_path / str(stepped), stepped=stepped)
        if stepped:
            session.files.rank_log(0).write_text("epoch 1 done\n")
        out = io.StringIO()
        HeadlessConsole(out, tty=False).summary(session, 100.0)
        assert ("without a step" in out.getvalue()) is not stepped
        assert "last lines of" not in out.getvalue()
        # no step, no evaluation to have had: the line does not ask for one (MMEngine's
        # example as published failed at its start, and its last line said how to report one)
        assert ("no evaluation" in out.getvalue()) is stepped


def test_the_failed_line_is_the_errors_head_where_the_log_tail_follows(tmp_path):
    """DeiT's RandAugment failing in a DataLoader worker: ``FAILED:`` printed torch's whole
    re-raised traceback, and the log's tail the same lines again. Without a tail, the whole
    error (torch.load's advice is in it)."""
    from ddptui.run.state import RankFailureInfo

    wrapped = (
        "ValueError: Caught ValueError in DataLoader worker process 0.\n"
        "Original Traceback (most recent call last):\n"
        '  File "/venv/lib/python3.11/site-packages/PIL/ImageOps.py", line 712, in posterize\n'
        "    raise ValueError(msg)\n"
        "ValueError: bits must be between or equal to 1 and 8"
    )
    for tail in ((), tuple(wrapped.splitlines()[-3:])):
        session = _ended_session(tmp_path / str(len(tail)), stepped=True)
        failure = RankFailureInfo(rank=0, exit_code=1, error=wrapped, stderr_tail=tail)
        session.state.set_outcome("failed", failure, now=3.0)
        out = io.StringIO()
        HeadlessConsole(out, tty=False).summary(session, 100.0)
        text = out.getvalue()
        if tail:
            assert (
                "FAILED: rank 0 exited with code 1: ValueError: bits must be between or "
                "equal to 1 and 8 (in DataLoader worker process 0) …\n" in text
            )
            assert text.count("raise ValueError(msg)") == 1  # the tail's
        else:
            assert f"FAILED: rank 0 exited with code 1: {wrapped}\n" in text


def test_a_failure_the_scripts_own_process_exited_0_after_says_so(tmp_path):
    """harveyp123/Pytorch-DDP-Example starts a ``Process`` per rank and joins them without a
    look at their exit codes: a rank raised, its peer lost it, the script exited 0, and plain
    torchrun with it. ddptui says the run failed (exit 1) and says why its code differs."""
    from ddptui.run.launcher import LaunchResult
    from ddptui.run.state import RankFailureInfo

    for code in (0, 1):
        session = _ended_session(tmp_path / str(code), stepped=True)
        session.result = LaunchResult(code)
        failure = RankFailureInfo(rank=1, error="RuntimeError: fault at epoch 1 batch 10")
        session.state.set_outcome("failed", failure, now=3.0)
        out = io.StringIO()
        HeadlessConsole(out, tty=False).summary(session, 100.0)
        text = out.getvalue()
        assert "FAILED: rank 1 failed: RuntimeError: fault at epoch 1 batch 10\n" in text
        said = "the script's own process exited 0 (it does not check how its workers ended)"
        assert (said in text) is (code == 0)


def test_a_failed_rank_is_one_line_as_it_fails():
    """torch.load's error is six lines (its advice after the fault): each failed rank printed
    it whole, and the run's end again, burying the run's own lines. The fault's line, marked
    when more follows; the whole message stays for the run's end and summary.json."""
    out = io.StringIO()
    console = HeadlessConsole(out, tty=False)
    state = RunState("r", 2)
    long = (
        "UnpicklingError: Weights only load failed.\n"
        "\t(1) Re-run with weights_only=False\n\nCheck the documentation."
    )
    events = [
        protocol.Status(run="r", rank=1, seq=0, t=0.0, state="failed", error=long),
        protocol.Status(run="r", rank=0, seq=0, t=0.0, state="failed", error="KeyError: 'x'"),
    ]
    console.on_events(state, events, now=1.0)
    assert out.getvalue().splitlines() == [
        "rank 1 failed: UnpicklingError: Weights only load failed. …",
        "rank 0 failed: KeyError: 'x'",
    ]


def test_replay_names_each_evaluation_as_the_run_did(tmp_path):
    """``ddptui replay --no-ui`` of kubeflow's MNIST example read ``epoch 0: accuracy 0.1020
    loss -- (None samples)`` where the run's own lines read ``epoch 1/2  accuracy 0.1020  eval
    loss --``: its epoch as the run numbered it, the samples only where counted."""
    import json
    import shutil

    from ddptui.runs.replay import print_replay
    from tests.tui_fixtures.fakes import RUNS

    run = tmp_path / "run"
    shutil.copytree(RUNS / "rec-ok", run)
    out = io.StringIO()
    print_replay(run, out)
    assert "  epoch 1: accuracy 1.0000 eval loss -- (2 samples)\n" in out.getvalue()
    events = run / "events.jsonl"
    events.write_text(events.read_text().replace('"count": 2', '"count": null'))
    config = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**config, "epochs": 2}))
    out = io.StringIO()
    print_replay(run, out)
    assert "  epoch 1/2: accuracy 1.0000 eval loss --\n" in out.getvalue()
    assert "None" not in out.getvalue()


class _Lingering:
    """What the session reads of a launcher whose ranks all finished but that still runs."""

    running = True

    def __init__(self):
        self.asked = 0

    def still_running(self):
        self.asked += 1
        return [(4101, "main.py"), (4107, "a multiprocessing child of 4101")]


def test_a_session_names_the_processes_still_running_after_every_rank_finished(tmp_path):
    """ijepa's main.py at 2 ranks: every rank finished, and a worker of the other launched
    copy waits in its rendezvous; the launcher runs on. Said once, once every rank has
    finished LINGER_S ago, naming what still runs; a verdict it is not (the run goes on)."""
    from ddptui.run.session import LINGER_S, RunSession

    cfg = build_config({"world_size": "2", "run_dir": str(tmp_path / "run")}, deep=False)
    session = RunSession(cfg, clock=lambda: 100.0)
    session.launcher = launcher = _Lingering()
    said = []
    try:
        for rank in (0, 1):
            status = protocol.Status(run=cfg.run_id, rank=rank, t=1.0, seq=0, state="started")
            session.state.apply(status, 10.0)
        session._watch_lingering(10.0 + LINGER_S + 5)  # running: nothing to say
        session.state.apply(
            protocol.Status(run=cfg.run_id, rank=0, t=1.0, seq=1, state="finished"), 20.0
        )
        session._watch_lingering(20.0 + LINGER_S + 5)  # rank 1 runs on
        session.state.apply(
            protocol.Status(run=cfg.run_id, rank=1, t=1.0, seq=1, state="finished"), 21.0
        )
        session._watch_lingering(22.0)  # every rank finished: counted from here
        for second in range(int(LINGER_S)):  # the process that started rank 0's worker
            beat = protocol.Beat(run=cfg.run_id, rank=0, t=1.0, seq=2 + second)
            session.state.apply(beat, 22.0 + second)  # beats on under rank 0, in its join
        session._watch_lingering(22.0 + LINGER_S - 1)  # too soon
        said += session.take_diagnoses()
        assert said == [] and launcher.asked == 0
        for second in range(3):
            session._watch_lingering(22.0 + LINGER_S + second)
            said += session.take_diagnoses()
    finally:
        session.launcher = None
        session.close()
    assert [d.cause for d in said] == ["lingering"] and launcher.asked == 1
    assert said[0].detail.startswith("ranks 0 and 1 finished 30 s ago, but 2 processes of the")
    assert "pid 4101 (main.py), pid 4107 (a multiprocessing child of 4101)" in said[0].detail
    assert [d.cause for d in session.diagnoser.diagnoses] == ["lingering"]
    assert "launch it as one process" not in said[0].detail


def test_the_lingering_note_of_a_copy_that_started_its_own_ranks_says_how_to_launch(tmp_path):
    """One of 2 launched copies said its workers formed a group of 2 (``workers_formed``):
    the copies start whole sets, and the note says to launch one a node."""
    from ddptui.run.session import LINGER_S, RunSession

    cfg = build_config({"world_size": "2", "run_dir": str(tmp_path / "run")}, deep=False)
    session = RunSession(cfg, clock=lambda: 100.0)
    session.launcher = _Lingering()
    try:
        note = protocol.Note(run=cfg.run_id, rank=1, t=1.0, seq=1, code="workers_formed", workers=2)
        session.state.apply(note, 9.0)
        assert session.state.spawners == {(None, 1): 2}
        for rank in (0, 1):
            for state in ("started", "finished"):
                status = protocol.Status(run=cfg.run_id, rank=rank, t=1.0, seq=2, state=state)
                session.state.apply(status, 10.0)
        session._watch_lingering(10.0)
        session._watch_lingering(10.0 + LINGER_S)
        (said,) = session.take_diagnoses()
    finally:
        session.launcher = None
        session.close()
    assert said.cause == "lingering" and said.detail.endswith(
        "; rank 1 spawned 2 workers of its own: the script starts its ranks itself (mp.spawn, "
        "a Process per rank), as under python script.py, and ddptui launched 2 copies of it a "
        "node, each to start a whole set; launch it as one process a node (--world-size 1; "
        "--nproc-per-node 1 on several nodes)"
    )


def test_an_output_that_went_away_is_said_once_and_never_raised(capsys):
    """``ddptui --no-ui … | head -2``: the third line raised BrokenPipeError out of the loop
    that drives the run, and ddptui stopped the run (a traceback at its end, exit code 1).
    Now the console says it once on standard error and writes no more."""

    class Gone(io.StringIO):
        writes = 0

        def write(self, text):
            Gone.writes += 1
            raise BrokenPipeError(32, "Broken pipe")

    console = HeadlessConsole(Gone(), tty=False)
    console.run_dir = "/runs/r"
    state = RunState("r", 2)
    for _ in range(3):
        console.line("rank 0 started")
        console.last_progress(state, 1.0)
    assert Gone.writes == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "ddptui: error printing the run (BrokenPipeError: [Errno 32] Broken pipe): the run "
        "goes on; its events are recorded in /runs/r"
    ]


class _LauncherFor:
    """A launcher of no process whose run ends by itself ``seconds`` after it starts."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def start(self) -> None:
        self.ends = time.monotonic() + self.seconds

    def poll(self) -> LaunchResult | None:
        return LaunchResult(0) if time.monotonic() > self.ends else None

    def stop(self, grace: float | None = None) -> LaunchResult:
        return LaunchResult(0, stopped=True)


def test_while_events_flow_the_headless_loop_pumps_a_batch_at_a_time(tmp_path, monkeypatch):
    """``ddptui --no-ui`` pumps at most every PUMP_EVERY_S while events flow (each pump then
    takes a batch): pumped as each message came, hundreds of pumps a second each found their
    code and data out of the CPU's caches (3.9 % of a core against 1.2 %, bench_tui.py)."""
    from ddptui import headless, protocol
    from ddptui.run.session import RunSession

    pumped: list[int] = []

    class Flowing(RunSession):  # a step on every pump, as a busy run has one waiting
        def _new_launcher(self):
            return _LauncherFor(1.5)  # the run ends a second and a half after it starts

        def pump(self, timeout: float = 0.1):
            n = len(pumped) + 1
            event = protocol.Step(run=self.cfg.run_id, rank=0, t=time.time(), seq=n, step=n)
            super().pump(0.0)
            self._record([event])
            if self.result is None and not self._concluding:  # not the end's drain
                pumped.append(n)
            return [event]

    monkeypatch.setattr(headless, "RunSession", Flowing)
    cfg = build_config({"run_dir": str(tmp_path / "run"), "backend": "gloo"}, Machine(0, "none", 2))
    out = io.StringIO()
    assert headless.run_headless(cfg, out=out) == 0
    assert headless.PUMP_EVERY_S == 0.25
    # 1.5 s at one pump every 0.25 s: 6 or 7 (as each came: thousands)
    assert 3 <= len(pumped) <= 12, len(pumped)
    assert "finished" in out.getvalue()


def test_sigterm_while_ddptui_handles_its_own_errors_still_ends_the_run(tmp_path, monkeypatch):
    """The teardown signals raise :class:`Interrupted` wherever the main thread is. Raised
    inside a part of the loop that says ddptui's own errors and goes on (applying an event,
    printing), it was taken for one of them: the signal was spent, the run went on, and
    ddptui outlived its SIGTERM (a test waited 30 s for it under a loaded suite). It ends the
    run, exit 143."""
    import os
    import signal

    from ddptui import headless, protocol
    from ddptui.run.session import RunSession

    pumps = [0]

    class Signalled(RunSession):
        def _new_launcher(self):
            return _LauncherFor(5.0)  # ends by itself after 5 s, or when stopped

        def pump(self, timeout: float = 0.1):
            pumps[0] += 1
            n = pumps[0]
            events = [protocol.Step(run=self.cfg.run_id, rank=0, t=time.time(), seq=n, step=n)]
            if pumps[0] == 3:
                apply = self.state.apply

                def apply_signalled(event, now=None):  # SIGTERM comes while one is applied
                    self.state.apply = apply
                    os.kill(os.getpid(), signal.SIGTERM)
                    time.sleep(0.5)  # the handler runs here
                    apply(event, now)

                self.state.apply = apply_signalled
            self._record(events)
            return events

    monkeypatch.setattr(headless, "RunSession", Signalled)
    cfg = build_config({"run_dir": str(tmp_path / "run"), "backend": "gloo"}, Machine(0, "none", 2))
    out = io.StringIO()
    began = time.monotonic()
    assert headless.run_headless(cfg, out=out) == 128 + signal.SIGTERM, out.getvalue()
    assert time.monotonic() - began < 4.0
    assert "interrupted (SIGTERM)" in out.getvalue()
