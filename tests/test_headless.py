"""``ddptui --no-ui`` end to end with the built-in synthetic trainer (real ranks, gloo)."""

import json
import subprocess
import sys

import pytest

from tests.helpers import processes_of_run, read_events

# One worker for the module: its tests share the module-scoped demo run.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("headless")]


def ddptui(*args, timeout=180):
    return subprocess.run(
        [sys.executable, "-m", "ddptui.cli", "--no-ui", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("default") / "run"
    proc = ddptui("--world-size", "2", "--run-dir", str(run_dir))
    return proc, run_dir


def test_default_demo_run_reaches_accuracy(default_run):
    proc, run_dir = default_run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    events = read_events(run_dir)
    assert {e["rank"] for e in events if e["kind"] == "step"} == {0, 1}
    evals = [e for e in events if e["kind"] == "eval"]
    assert {e["rank"] for e in evals} == {0, 1}
    final = max(evals, key=lambda e: e["epoch"])
    assert final["accuracy"] >= 0.95
    assert f"final accuracy {final['accuracy']:.4f}" in proc.stdout
    assert (run_dir / "config.json").is_file() and (run_dir / "checkpoint.pt").is_file()
    assert (run_dir / "rank-0.log").is_file() and (run_dir / "rank-1.log").is_file()
    finished = [e for e in events if e["kind"] == "status" and e["state"] == "finished"]
    assert sorted(e["rank"] for e in finished) == [0, 1]  # sent before each rank exited
    ends = [(e["rank"], e["epoch"]) for e in events if e["kind"] == "epoch"]
    assert len(ends) == len(set(ends)) == 2 * final["epoch"]  # each epoch ends once per rank
    assert processes_of_run(events[0]["run"]) == []


def test_finished_run_writes_its_summary(default_run):
    proc, run_dir = default_run
    summary = json.loads((run_dir / "summary.json").read_text())
    evals = [e for e in read_events(run_dir) if e["kind"] == "eval"]
    assert summary["outcome"] == "finished" and summary["exit_code"] == 0
    assert summary["final_accuracy"] == evals[-1]["accuracy"]
    ranks = [(r["rank"], r["state"]) for r in summary["ranks"]]
    assert ranks == [(0, "finished"), (1, "finished")]
    assert summary["failure"] is None


def test_events_are_a_public_jsonl_format(default_run):
    _, run_dir = default_run
    events = read_events(run_dir)
    kinds = {e["kind"] for e in events}
    assert {"status", "step", "eval", "epoch"} <= kinds
    started = [e for e in events if e["kind"] == "status" and e["state"] == "started"]
    assert {e["rank"] for e in started} == {0, 1}
    assert all(e["pid"] and e["host"] for e in started)  # from the rank's entry on
    last = {e["rank"]: e for e in started}  # the last started status tells the most
    assert all(e["epochs"] == 3 and e["steps_per_epoch"] == 63 for e in last.values())
    assert all(e["device"] == "cpu" for e in last.values())
    step = next(e for e in events if e["kind"] == "step" and e["samples_per_s"])
    assert {"epoch", "step", "loss", "samples", "samples_per_s", "step_time"} <= set(step)
    for rank in (0, 1):  # per-rank sequence numbers without gaps: nothing was dropped
        seqs = [e["seq"] for e in events if e["rank"] == rank and e["kind"] != "beat"]
        assert seqs == list(range(len(seqs)))
        beats = [e for e in events if e["rank"] == rank and e["kind"] == "beat"]
        assert all(b["seq"] <= max(seqs) for b in beats)  # a beat repeats the last number


def test_builtin_trainer_steps_carry_phases(default_run):
    """The trainers call ddptui.log themselves; the zero-code hooks still time the phases and
    attach them to each explicit step (and send no steps of their own)."""
    from ddptui.constants import PHASES

    _, run_dir = default_run
    steps = [e for e in read_events(run_dir) if e["kind"] == "step"]
    assert steps and all(set(PHASES) <= set(e["phases"] or {}) for e in steps)
    for rank in (0, 1):
        numbers = [e["step"] for e in steps if e["rank"] == rank]
        assert numbers == list(range(1, len(numbers) + 1))  # one event per step, no doubles
    summary = json.loads((run_dir / "summary.json").read_text())
    assert isinstance(summary["diagnoses"], list)


def test_replay_summarises_the_run(default_run):
    _, run_dir = default_run
    out = subprocess.run(
        [sys.executable, "-m", "ddptui.cli", "replay", "--no-ui", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "finished" in out.stdout and "rank 1: finished" in out.stdout


def test_resume_under_torchrun_with_bf16_continues_at_next_epoch(tmp_path, default_run):
    _, first_dir = default_run
    first = read_events(first_dir)
    done = max(e["epoch"] for e in first if e["kind"] == "eval")
    run_dir = tmp_path / "resumed"
    proc = ddptui(
        "--launcher",
        "torchrun",
        "--amp",
        "bf16",
        "--world-size",
        "2",
        "--epochs",
        str(done + 1),
        "--resume",
        str(first_dir / "checkpoint.pt"),
        "--run-dir",
        str(run_dir),
        "--",
        "--train-size",  # a quarter of the demo's epoch: bf16 matmuls are slow on CPU
        "1000",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    events = read_events(run_dir)
    assert {e["epoch"] for e in events if e["kind"] == "step"} == {done + 1}
    evals = [e for e in events if e["kind"] == "eval"]
    assert {e["epoch"] for e in evals} == {done + 1}
    # Started from the saved weights: already accurate in its only epoch.
    assert min(e["accuracy"] for e in evals) >= 0.95


def test_file_init_method_as_in_the_manual_recipe(tmp_path):
    run_dir = tmp_path / "run"
    store = tmp_path / "rendezvous"
    proc = ddptui(
        "--world-size",
        "2",
        "--epochs",
        "1",
        "--init-method",
        f"file://{store}",
        "--run-dir",
        str(run_dir),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    events = read_events(run_dir)
    assert {e["rank"] for e in events if e["kind"] == "eval"} == {0, 1}
    config = json.loads((run_dir / "config.json").read_text())
    assert config["init_method"] == f"file://{store}"
