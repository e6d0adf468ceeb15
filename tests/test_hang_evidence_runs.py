"""Hang verdicts on evidence, end to end (#20): a long, busy preparation before the first step
is not a hang; a rank that stalls before its first step is named within --hang-timeout (no
hidden 60 s floor), with every rank's stack captured. A plain script, no ddptui import."""

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT, processes_of_run, read_events

pytestmark = pytest.mark.slow

PLAIN = ROOT / "tests" / "scripts" / "plain_ddp.py"


def run_plain(run_dir, env, *args, timeout=150):
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    cmd = [sys.executable, "-m", "ddptui.cli", "--no-ui", "--script", str(PLAIN)]
    cmd += ["--world-size", "2", "--run-dir", str(run_dir), *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env)
    finally:
        run_id = json.loads((run_dir / "config.json").read_text())["run_id"]
        for leftover in processes_of_run(run_id):
            leftover.kill()
    return proc, json.loads((run_dir / "summary.json").read_text())


def test_a_busy_preparation_twice_the_timeout_is_not_a_hang(tmp_path):
    env = {"PLAIN_PREPARE_S": "12", "PLAIN_EPOCHS": "1", "PLAIN_STEPS": "10"}
    proc, summary = run_plain(tmp_path / "run", env, "--hang-timeout", "6")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert summary["outcome"] == "finished"
    assert not [d for d in summary["diagnoses"] if d["cause"] in ("hang", "collective")]
    events = read_events(tmp_path / "run")
    # announced at entry (pid, host) and seen preparing, in the script's own function
    started = [e for e in events if e["kind"] == "status" and e["state"] == "started"]
    assert {e["rank"] for e in started} == {0, 1} and all(e["pid"] for e in started)
    frames = {e["frame"] for e in events if e["kind"] == "beat" and e["steps"] == 0}
    assert any(f and f.startswith("prepare (plain_ddp.py:") for f in frames), frames
    assert "preparing (" in proc.stdout
    steps = [e for e in events if e["kind"] == "step"]
    assert sorted(e["rank"] for e in steps) == [0] * 10 + [1] * 10
    assert not list((tmp_path / "run").glob("stacks-rank-*.txt"))  # no empty dump files


def test_a_stall_before_the_first_step_is_named_within_the_timeout(tmp_path):
    env = {"PLAIN_HANG_RANK": "1", "PLAIN_HANG_EPOCH": "1"}
    proc, summary = run_plain(tmp_path / "run", env, "--hang-timeout", "5")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert summary["outcome"] == "hung"
    culprit = [d for d in summary["diagnoses"] if d["cause"] == "hang" and d["rank"] == 1]
    assert culprit and "stall_forever (plain_ddp.py:" in culprit[0]["detail"]
    # every rank's stack was captured (their pids were known from the start)
    assert set(summary["stacks"]) == {"0", "1"}
    for rank in (0, 1):
        assert (tmp_path / "run" / f"stacks-rank-{rank}.txt").stat().st_size > 0
    # named within the limit (5 s) plus a beat or two: no hidden floor before the first step
    still = int(culprit[0]["detail"].split("stood still for ")[1].split(" s")[0])
    assert 5 <= still <= 10, culprit[0]["detail"]
    assert "ETA 0s" not in proc.stdout
    assert "the stacks of ranks 0, 1 are in summary.json" in proc.stdout
