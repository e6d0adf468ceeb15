"""``--max-restarts``: relaunch the whole group after a rank fails, from the last checkpoint.

Unit tests of the attempt bookkeeping (RunState, summary.json, the checks before a restart),
then real CPU runs (slow): a SIGKILLed rank under the built-in trainer, a user script that
resumes from ``DDPTUI_RESUME`` under torchrun, a crash that repeats.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from ddptui import protocol
from ddptui.rank.reporter import attempt_from_env
from ddptui.run.check_files import check_restart_checkpoint
from ddptui.run.config import build_config
from ddptui.run.launcher import LaunchResult
from ddptui.run.options import ConfigError
from ddptui.run.rundir import summarize
from ddptui.run.session import RunSession, failure_key
from ddptui.run.state import AttemptRecord, RankFailureInfo, RunState
from ddptui.runfiles import RunDir
from tests.helpers import ROOT, processes_of_run, read_events, wait_until


def step(rank, seq, step_no, attempt=0, epoch=1, loss=1.0):
    return protocol.Step(
        run="r",
        rank=rank,
        t=100.0 + seq,
        seq=seq,
        step=step_no,
        epoch=epoch,
        loss=loss,
        samples=4,
        attempt=attempt,
    )


# -- RunState across attempts ------------------------------------------------------------------
def test_a_new_attempt_restarts_seq_without_gaps_and_continues_the_series():
    state = RunState("r", 1)
    for i in range(5):
        state.apply(step(0, i, i + 1), now=float(i))
    state.apply(step(0, 0, 1, attempt=1, epoch=3), now=10.0)
    state.apply(step(0, 1, 2, attempt=1, epoch=3), now=11.0)
    view = state.ranks[0]
    assert view.gaps == 0 and view.attempt == 1
    assert [x for x, _ in view.loss_series] == [1, 2, 3, 4, 5, 6, 7]  # no jump back to 1
    assert view.epoch == 3 and view.steps_in_epoch == 2
    state.apply(step(0, 7, 9, attempt=0), now=12.0)  # late news from attempt 0: ignored
    assert view.step == 7 and state.events_ignored == 1


def test_begin_attempt_resets_ranks_to_pending_and_a_later_eval_replaces_an_earlier():
    state = RunState("r", 2)
    state.begin_attempt(AttemptRecord(0, 1.0))
    state.apply(protocol.Status(run="r", rank=0, t=1, seq=0, state="started", pid=5), now=1)
    state.apply(protocol.Eval(run="r", rank=0, t=2, seq=1, epoch=3, accuracy=0.5), now=2)
    state.begin_attempt(AttemptRecord(1, 3.0, resumed_from_epoch=2))
    assert [v.state for v in state.ranks.values()] == ["pending", "pending"]
    assert state.attempt == 1
    state.apply(protocol.Eval(run="r", rank=0, t=4, seq=0, epoch=3, accuracy=0.9, attempt=1), now=4)
    assert state.last_eval.accuracy == 0.9


def test_summary_lists_the_attempts():
    state = RunState("r", 2)
    state.begin_attempt(AttemptRecord(0, 1_700_000_000.0))
    state.end_attempt("failed", RankFailureInfo(rank=1, signal="SIGKILL"))
    state.begin_attempt(AttemptRecord(1, 1_700_000_100.0, "/x/checkpoint.pt", 2))
    state.end_attempt("finished")
    doc = summarize(state, "finished")
    assert doc["restarts"] == 1
    first, second = doc["attempts"]
    assert first["outcome"] == "failed" and "SIGKILL" in first["failure"]["how"]
    assert first["started_at"].startswith("2023-11-14T22:13:20")
    assert second == {
        "attempt": 1,
        "started_at": "2023-11-14T22:15:00+00:00",
        "outcome": "finished",
        "failure": None,
        "resumed_from": "/x/checkpoint.pt",
        "resumed_from_epoch": 2,
    }
    json.dumps(doc, allow_nan=False)


def test_events_carry_the_attempt_from_the_environment(monkeypatch):
    monkeypatch.delenv("DDPTUI_ATTEMPT", raising=False)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    assert attempt_from_env() == 2
    monkeypatch.setenv("DDPTUI_ATTEMPT", "3")
    assert attempt_from_env() == 3
    monkeypatch.setenv("DDPTUI_ATTEMPT", "999999")
    assert attempt_from_env() == protocol.MAX_ATTEMPT
    monkeypatch.setenv("DDPTUI_ATTEMPT", "-1")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "x")
    assert attempt_from_env() == 0
    wire = protocol.encode_batch([step(0, 0, 1)])
    assert b"\xa7attempt\x00" in wire
    for bad in (b"\xa7attempt\xff", b"\xa7attempt\xcd\x03\xe9"):  # -1, 1001
        with pytest.raises(protocol.InvalidEvent):
            protocol.decode_batch(wire.replace(b"\xa7attempt\x00", bad))


# -- options and checks ------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["-1", "101", "x", "1e400", ""])
def test_max_restarts_is_validated(value, tmp_path):
    raw = {"device": "cpu", "run_dir": str(tmp_path / "r"), "max_restarts": value}
    if value == "":
        assert build_config(raw, deep=False).max_restarts == 0
        return
    with pytest.raises(ConfigError, match="max.restarts"):
        build_config(raw, deep=False)


def test_max_restarts_is_kept(tmp_path):
    cfg = build_config({"device": "cpu", "run_dir": str(tmp_path / "r"), "max_restarts": "100"})
    assert cfg.max_restarts == 100 and cfg.to_json_dict()["max_restarts"] == 100


def _cfg(tmp_path, **extra):
    raw = {"device": "cpu", "run_dir": str(tmp_path / "run"), "max_restarts": "2", **extra}
    return build_config(raw, deep=False)


class _NoCollector:
    endpoint = "ipc:///nonexistent"

    def poll(self, timeout):
        return []

    def close(self):
        pass


def _failed_session(tmp_path, checkpoint_bytes: bytes | None):
    session = RunSession(_cfg(tmp_path))
    session.run_dir.mkdir(parents=True)
    session.collector = _NoCollector()
    session.state.begin_attempt(AttemptRecord(0, time.time()))
    if checkpoint_bytes is not None:
        session.files.checkpoint.write_bytes(checkpoint_bytes)
    return session


def test_a_torn_checkpoint_is_refused_at_restart_with_one_line(tmp_path):
    session = _failed_session(tmp_path, b"PK\x03\x04torn")
    failure = RankFailureInfo(rank=1, signal="SIGKILL")
    assert session._restart(LaunchResult(-9, failure=failure)) is False
    assert "not a checkpoint" in session.restart_refused
    assert "\n" not in session.restart_refused
    assert session.state.attempts[0].outcome == "failed"


def test_a_scripts_restart_without_the_runs_checkpoint_is_not_said_from_scratch(
    tmp_path, monkeypatch
):
    """torchtitan resumes from checkpoints of its own (its step 15, then 16) that ddptui
    does not know: its restart said "from scratch"."""
    script = tmp_path / "train.py"
    script.write_text("print('train')\n")
    session = RunSession(_cfg(tmp_path, script=str(script)))
    session.run_dir.mkdir(parents=True)
    session.collector = _NoCollector()
    session.state.begin_attempt(AttemptRecord(0, time.time()))
    monkeypatch.setattr("ddptui.run.session.Launcher.start", lambda self: None)
    failure = RankFailureInfo(rank=1, exit_code=1)
    assert session._restart(LaunchResult(1, failure=failure)) is True
    assert session.restart_lines == [
        "restart 1/2: rank 1 exited with code 1; the script starts again, from its own "
        "checkpoint if it keeps one"
    ]


def test_a_foreign_checkpoint_is_refused(tmp_path):
    import torch

    path = tmp_path / "foreign.pt"
    torch.save({"epoch": 1, "model": {}, "config": {"trainer": "mnist", "model": None}}, path)
    problem, _ = check_restart_checkpoint(_cfg(tmp_path), str(path))
    assert problem is not None and "'mnist' trainer" in problem


def test_the_same_failure_twice_from_the_same_checkpoint_is_not_restarted(tmp_path, monkeypatch):
    session = _failed_session(tmp_path, None)  # no checkpoint: both attempts from scratch
    started = []
    monkeypatch.setattr(
        "ddptui.run.session.Launcher.start", lambda self: started.append(self.extra_env)
    )
    failure = RankFailureInfo(rank=1, exit_code=3, error="boom")
    assert session._restart(LaunchResult(1, failure=failure)) is True
    assert started[-1]["DDPTUI_ATTEMPT"] == "1" == started[-1]["TORCHELASTIC_RESTART_COUNT"]
    assert "DDPTUI_RESUME" not in started[-1]
    assert session.restart_lines == ["restart 1/2: rank 1 exited with code 3: boom; from scratch"]
    assert session._restart(LaunchResult(1, failure=failure)) is False
    assert session.restart_refused == (
        "the same failure twice from the same checkpoint: attempt 1: rank 1 exited with code 3: "
        "boom; attempt 2: rank 1 exited with code 3: boom"
    )
    assert failure_key(failure) != failure_key(RankFailureInfo(rank=0, exit_code=3, error="boom"))


# -- real runs ---------------------------------------------------------------------------------
def _ddptui(run_dir, *args, timeout=150):
    cmd = [sys.executable, "-m", "ddptui.cli", "--no-ui", "--run-dir", str(run_dir), *args]
    return subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _finish(proc, run_dir, timeout=150):
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        run_id = json.loads(RunDir(run_dir).config.read_text())["run_id"]
        for leftover in processes_of_run(run_id):
            leftover.kill()
    assert wait_until(lambda: processes_of_run(run_id) == [], 10) is not None
    return out, err


def _events(run_dir):
    """The events written so far (a line being written is skipped)."""
    events = []
    path = RunDir(run_dir).events
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    return events


#: Four epochs: a kill after the second leaves two to resume; a stop after the first, three.
EPOCHS = 4
TRAIN = ["--epochs", str(EPOCHS), "--seed", "3", "--", "--train-size", "1600", "--test-size", "300"]


def _kill_rank_1_after_epoch_2(run_dir):
    """SIGKILL rank 1 once rank 0 has printed epoch 2 (after writing its checkpoint).

    Rank 1's pid is read first, so that the kill follows the epoch line at once: an epoch
    of this small run takes a fraction of a second on an idle machine."""

    def rank_1_pid():
        return next(
            (
                e["pid"]
                for e in _events(run_dir)
                if e["kind"] == "status" and e["rank"] == 1 and e["state"] == "started" and e["pid"]
            ),
            None,
        )

    pid = wait_until(rank_1_pid, 90, 0.02)
    assert pid, "rank 1 never started"
    log = RunDir(run_dir).rank_log(0)
    assert wait_until(lambda: log.exists() and f"epoch 2/{EPOCHS}" in log.read_text(), 90, 0.005)
    killed_at = time.time()
    os.kill(pid, signal.SIGKILL)
    return killed_at


@pytest.mark.slow
def test_a_killed_rank_is_restarted_from_the_checkpoint(tmp_path):
    """Two runs side by side (same seed): rank 1 SIGKILLed after epoch 2 with
    --max-restarts 1 (restarted), and the uninterrupted reference the restarted run must
    match. Without --max-restarts a killed rank fails the run with one attempt: the real-world
    tier's ``trainer_kill`` run (tests/test_realworld.py)."""
    run_dir, reference = tmp_path / "run", tmp_path / "ref"
    procs = {
        run_dir: _ddptui(run_dir, "--max-restarts", "1", *TRAIN),
        reference: _ddptui(reference, *TRAIN),
    }
    outputs = {}
    try:
        killed_at = _kill_rank_1_after_epoch_2(run_dir)
    finally:
        for path, proc in procs.items():
            outputs[path] = _finish(proc, path)
    codes = {path: proc.returncode for path, proc in procs.items()}
    assert codes == {run_dir: 0, reference: 0}, outputs
    # --max-restarts 1: a second attempt from the checkpoint finishes the run.
    out = outputs[run_dir][0]
    summary = json.loads(RunDir(run_dir).summary.read_text())
    assert len(summary["attempts"]) == 2 and summary["restarts"] == 1
    first, second = summary["attempts"]
    assert first["outcome"] == "failed" and "rank 1 was killed by signal SIGKILL" in out
    assert second["outcome"] == "finished" and second["resumed_from_epoch"] >= 2
    assert "restart 1/1: rank 1 was killed by signal SIGKILL; resuming from checkpoint.pt" in out
    steps = [e for e in read_events(run_dir) if e["kind"] == "step"]
    assert all(e["epoch"] > 2 for e in steps if e["t"] > killed_at)
    assert {e["epoch"] for e in steps if e["attempt"] == 1} == set(
        range(second["resumed_from_epoch"] + 1, EPOCHS + 1)
    )
    expected = json.loads(RunDir(reference).summary.read_text())["final_accuracy"]
    assert abs(summary["final_accuracy"] - expected) <= 0.01


@pytest.mark.slow
def test_a_user_script_resumes_from_ddptui_resume_under_torchrun(tmp_path):
    run_dir = tmp_path / "run"
    script = ROOT / "tests" / "scripts" / "resumable.py"
    proc = _ddptui(
        run_dir, "--script", str(script), "--launcher", "torchrun", "--max-restarts", "2"
    )
    out, err = _finish(proc, run_dir)
    assert proc.returncode == 0, out + err
    summary = json.loads(RunDir(run_dir).summary.read_text())
    assert [a["outcome"] for a in summary["attempts"]] == ["failed", "finished"]
    assert "restart 1/2: rank 1 exited with code 3" in out
    evals = [e for e in read_events(run_dir) if e["kind"] == "eval"]
    assert evals and all(e["attempt"] == 1 and e["metrics"]["resumed_from"] == 5 for e in evals)
    log = RunDir(run_dir).rank_log(1).read_text()
    assert f"attempt 1 resume {RunDir(run_dir).checkpoint} from 5" in log


@pytest.mark.slow
def test_a_crash_that_repeats_ends_the_run_naming_it(tmp_path):
    run_dir = tmp_path / "run"
    script = ROOT / "tests" / "scripts" / "rank_fails.py"
    proc = _ddptui(
        run_dir,
        "--script",
        str(script),
        "--launcher",
        "spawn",
        "--max-restarts",
        "3",
        "--",
        "--how",
        "exit",
    )
    out, err = _finish(proc, run_dir)
    assert proc.returncode == 1, out + err
    summary = json.loads(RunDir(run_dir).summary.read_text())
    assert len(summary["attempts"]) == 2  # the same failure from the same (no) checkpoint
    assert summary["restart_refused"].startswith("the same failure twice from the same checkpoint")
    assert "not restarted: the same failure twice" in out
    assert out.count("rank 1 exited with code 3") >= 2


# -- stop with a checkpoint --------------------------------------------------------------------
@pytest.mark.slow
def test_first_ctrl_c_stops_with_a_checkpoint_and_the_run_resumes_from_it(tmp_path):
    import torch

    run_dir = tmp_path / "run"
    proc = _ddptui(run_dir, *TRAIN)
    try:
        log = RunDir(run_dir).rank_log(0)
        assert wait_until(lambda: log.exists() and f"epoch 1/{EPOCHS}" in log.read_text(), 90, 0.02)
        proc.send_signal(signal.SIGINT)
    finally:
        out, err = _finish(proc, run_dir)  # also: no process of the run is left
    assert proc.returncode == 130, out + err
    assert "stopping after the current step with a checkpoint" in out
    assert f"to continue: ddptui --resume {run_dir}" in out
    summary = json.loads(RunDir(run_dir).summary.read_text())
    assert summary["outcome"] == "stopped" and summary["exit_code"] == 130
    state = torch.load(RunDir(run_dir).checkpoint, weights_only=True)
    steps = [e for e in read_events(run_dir) if e["kind"] == "step" and e["rank"] == 0]
    stopped_in = steps[-1]["epoch"]
    if "partial" in state:  # stopped mid-epoch: the epoch in progress and its steps done
        assert state["partial"] == {"epoch": stopped_in, "steps": state["partial"]["steps"]}
        assert state["epoch"] == stopped_in - 1
    else:  # the agreed step was an epoch's last
        assert state["epoch"] == stopped_in
    # --resume RUN_DIR: the saved options and checkpoint, a new run directory.
    again = tmp_path / "again"
    resumed = _ddptui(again, "--resume", str(run_dir))
    out, err = _finish(resumed, again)
    assert resumed.returncode == 0, out + err
    config = json.loads(RunDir(again).config.read_text())
    assert config["resume"] == str(RunDir(run_dir).checkpoint) and config["seed"] == 3
    first = next(e for e in read_events(again) if e["kind"] == "step" and e["rank"] == 0)
    assert first["epoch"] == state.get("partial", {}).get("epoch", state["epoch"] + 1)
    assert json.loads(RunDir(again).summary.read_text())["final_eval"]["epoch"] == EPOCHS


def test_resume_command_repeats_the_options(tmp_path):
    from ddptui.run.options import resume_command

    cfg = _cfg(tmp_path, epochs="4", lr="0.5", script_args=("--train-size", "8 00"))
    line = resume_command(cfg)
    assert line.startswith(f"ddptui --resume {tmp_path / 'run' / 'checkpoint.pt'} --trainer ")
    assert "--epochs 4" in line and "--lr 0.5" in line and "--max-restarts 2" in line
    assert line.endswith("-- --train-size '8 00'")


def test_a_script_runs_resume_takes_none_of_the_trainers_options(tmp_path):
    from ddptui.cli import continue_run_dir
    from ddptui.run.options import resume_command
    from ddptui.runfiles import write_json_atomic

    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    cfg = _cfg(tmp_path, script=str(script), script_args=("--lr", "0.3"))
    line = resume_command(cfg)
    assert f"--script {script}" in line and line.endswith("-- --lr 0.3")
    # the defaults a script's config holds (seed 0, workers 0) are not options it took
    assert "--seed" not in line.split(" -- ")[0] and "--workers" not in line
    RunDir(cfg.run_dir).path.mkdir(parents=True)
    write_json_atomic(RunDir(cfg.run_dir).config, cfg.to_json_dict())
    RunDir(cfg.run_dir).checkpoint.write_bytes(b"x")
    raw = continue_run_dir({"resume": cfg.run_dir, "script_args": ()})
    assert raw["script"] == str(script) and "seed" not in raw and "workers" not in raw
    with pytest.raises(ConfigError, match="--lr is for the built-in trainers"):
        continue_run_dir({"resume": cfg.run_dir, "lr": "0.1"})


def test_resume_run_dir_takes_the_saved_options(tmp_path):
    from ddptui.cli import continue_run_dir
    from ddptui.runfiles import write_json_atomic

    saved = _cfg(tmp_path, epochs="4", script_args=("--train-size", "800"))
    RunDir(saved.run_dir).path.mkdir(parents=True)
    write_json_atomic(RunDir(saved.run_dir).config, saved.to_json_dict())
    with pytest.raises(ConfigError, match="has no checkpoint.pt"):
        continue_run_dir({"resume": saved.run_dir})
    RunDir(saved.run_dir).checkpoint.write_bytes(b"x")
    raw = continue_run_dir({"resume": saved.run_dir, "epochs": "9", "script_args": ()})
    assert raw["epochs"] == "9" and raw["max_restarts"] == 2 and raw["device"] == "cpu"
    assert raw["script_args"] == ("--train-size", "800")
    assert raw["resume"] == str(RunDir(saved.run_dir).checkpoint) and "run_dir" not in raw
    with pytest.raises(ConfigError, match="not a run directory"):
        continue_run_dir({"resume": str(tmp_path)})


def test_first_ctrl_c_asks_gently_and_the_second_tears_down():
    from ddptui.run.signals import Interrupted, SignalGuard

    guard = SignalGuard()
    guard.gentle = True
    guard.handler(signal.SIGINT, None)  # no exception: the loop asks for the checkpoint stop
    assert guard.gentle_asked
    with pytest.raises(Interrupted):
        guard.handler(signal.SIGINT, None)
    term = SignalGuard()
    term.gentle = True
    with pytest.raises(Interrupted):  # SIGTERM is never gentle
        term.handler(signal.SIGTERM, None)


def test_a_stop_with_a_checkpoint_is_overdue_after_30_s_without_events(tmp_path):
    now = [100.0]
    session = RunSession(_cfg(tmp_path), clock=lambda: now[0])
    assert not session.stop_overdue()
    session.checkpoint_stop_at = 100.0
    now[0] = 129.0
    assert not session.stop_overdue()
    session.state.last_event_at = 120.0  # the ranks still report: still making progress
    now[0] = 140.0
    assert not session.stop_overdue()
    now[0] = 150.5
    assert session.stop_overdue()


def test_a_script_is_never_asked_to_stop_with_a_checkpoint(tmp_path):
    script = ROOT / "tests" / "scripts" / "resumable.py"
    session = RunSession(_cfg(tmp_path, script=str(script)))
    for view in session.state.ranks.values():
        view.state, view.pid = "started", 1
    session.launcher = object()
    assert not session.can_stop_with_checkpoint()
    trainer = RunSession(_cfg(tmp_path))
    for view in trainer.state.ranks.values():
        view.state, view.pid = "started", 1
    trainer.launcher = object()
    assert trainer.can_stop_with_checkpoint()


def test_the_header_names_the_attempt_and_the_loss_chart_marks_it():
    from ddptui.tui.model import attempt_label, chart_data

    state = RunState("r", 1)
    state.max_restarts = 2
    state.begin_attempt(AttemptRecord(0, 1.0))
    assert attempt_label(state) == ""
    for i in range(3):
        state.apply(step(0, i, i + 1), now=float(i))
    state.end_attempt("failed", RankFailureInfo(rank=0, signal="SIGKILL"))
    state.begin_attempt(AttemptRecord(1, 2.0))
    state.apply(step(0, 0, 1, attempt=1), now=5.0)
    assert attempt_label(state) == (
        "attempt 2/3 (failed attempts 1: rank 0 was killed by signal SIGKILL)"
    )
    data = chart_data(state)
    assert data.restarts == (3.0,) and data.mean_loss[0] == [1.0, 2.0, 3.0, 4.0]


def test_a_replayed_run_shows_its_attempts(tmp_path):
    from ddptui.run.rundir import load_run, write_summary
    from ddptui.runfiles import write_json_atomic

    cfg = _cfg(tmp_path)
    RunDir(cfg.run_dir).path.mkdir(parents=True)
    write_json_atomic(RunDir(cfg.run_dir).config, cfg.to_json_dict())
    state = RunState(cfg.run_id, 2)
    state.begin_attempt(AttemptRecord(0, 1_700_000_000.0))
    state.end_attempt("failed", RankFailureInfo(rank=1, signal="SIGKILL"))
    state.begin_attempt(AttemptRecord(1, 1_700_000_100.0, "/x/checkpoint.pt", 2))
    state.end_attempt("finished")
    doc = summarize(state, "finished")
    doc["attempts"].append({"attempt": "x"})  # malformed: skipped
    write_summary(cfg.run_dir, doc)
    _, replayed, _ = load_run(cfg.run_dir)
    assert [(a.attempt, a.outcome) for a in replayed.attempts] == [(0, "failed"), (1, "finished")]
    assert replayed.attempts[0].failure.describe() == "rank 1 was killed by signal SIGKILL"
    assert replayed.max_restarts == 2 and replayed.attempts[1].resumed_from_epoch == 2
