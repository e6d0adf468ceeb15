"""How each rank ended, as the ranks report it: an uncaught exception or a non-zero exit is
``failed`` with the error and the traceback, under both launchers; exit 0 is ``finished``."""

import os
import subprocess
import sys
import time

import pytest

from ddptui import protocol
from ddptui.run.collector import Collector
from ddptui.run.config import build_config
from ddptui.run.launcher import Launcher
from ddptui.run.machine import Machine
from ddptui.run.rundir import load_run
from ddptui.run.session import RunSession
from tests.helpers import ROOT, processes_of_run

pytestmark = pytest.mark.slow
CPU = Machine(0, "no CUDA", 2)
FAILING_SCRIPT = ROOT / "tests" / "scripts" / "rank_fails.py"


def run_and_collect(tmp_path, launcher, run_id, timeout=120.0, **target):
    """Run 2 ranks to the end; the launcher's result and every event received."""
    events = []
    with Collector(run_id, world_size=2) as collector:
        run = Launcher(launcher, 2, tmp_path / "run", run_id, collector.endpoint, **target)
        run.start()
        try:
            deadline = time.monotonic() + timeout
            while run.poll() is None and time.monotonic() < deadline:
                events += collector.poll(0.1)
            result = run.stop()
            drain_until = time.monotonic() + 1.0
            while time.monotonic() < drain_until:
                events += collector.poll(0.1)
        finally:
            run.stop(grace=1.0)
    assert processes_of_run(run_id) == []
    return result, events


def final_status(events, rank):
    statuses = [e for e in events if type(e).__name__ == "Status" and e.rank == rank]
    assert statuses, f"rank {rank} sent no status"
    return statuses[-1]


# Real runs, one per launcher (each mode also runs through the rank entry alone, below), each
# through ddptui's whole session: its result, its run directory and the replay of it.
@pytest.mark.parametrize(
    ("launcher", "how", "error", "code", "where"),
    [
        ("spawn", "raise", "RuntimeError: boom on rank 1", 1, 'raise RuntimeError(f"boom'),
        ("torchrun", "exit", "SystemExit: 3", 3, "sys.exit(3)"),
    ],
)
def test_a_rank_that_raised_or_exited_non_zero_is_failed_with_its_traceback(
    tmp_path, launcher, how, error, code, where, monkeypatch
):
    temp = tmp_path / "tmp"  # the launcher's temporary files: torchrun's log directory
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    raw = {"run_dir": str(tmp_path / "run"), "script": str(FAILING_SCRIPT), "launcher": launcher}
    raw.update(world_size="2", script_args=("--how", how))
    session = RunSession(build_config(raw, CPU))
    deadline = time.monotonic() + 120
    with session:
        session.start()
        while session.poll() is None and time.monotonic() < deadline:
            session.pump(0.1)
        assert session.result is not None, "the run did not end in time"
    result = session.result
    assert not result.ok and result.failure is not None
    assert (result.failure.rank, result.failure.exit_code) == (1, code)
    # an exception's traceback reaches stderr; sys.exit(3) prints nothing
    tail = error if how == "raise" else None
    if tail:
        assert any(tail in line for line in result.failure.stderr_tail), result.failure
    events = [protocol.from_json(line) for line in session.events_path.read_bytes().splitlines()]
    ok, failed = final_status(events, 0), final_status(events, 1)
    assert (ok.state, ok.error, ok.traceback) == ("finished", None, None)
    assert (failed.state, failed.error) == ("failed", error)
    assert failed.traceback.startswith("Traceback (most recent call last):")
    assert "rank_fails.py" in failed.traceback and where in failed.traceback
    assert session.state.ranks[1].state == "failed"
    assert processes_of_run(session.cfg.run_id) == []
    assert list(temp.glob("torchelastic_*")) == []  # its error files read, it is gone
    # Replaying the run directory tells the same story.
    _, replayed, _ = load_run(session.run_dir)
    assert replayed.status == "failed" and replayed.failure.rank == 1
    assert replayed.failure.exit_code == code
    if tail:
        assert any(tail in line for line in replayed.failure.stderr_tail)


def test_a_built_in_trainer_that_raised_is_failed_with_its_traceback(tmp_path):
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint")
    result, events = run_and_collect(
        tmp_path,
        "spawn",
        "outcome-trainer",
        module="trainers.synthetic",
        args=["--epochs", "1", "--resume", str(garbage)],
    )
    assert not result.ok
    statuses = [final_status(events, rank) for rank in (0, 1)]
    assert not any(status.state == "finished" for status in statuses)
    # The first rank to fail ends the run: mp.spawn then stops the other, which on a loaded
    # machine may not have reached the checkpoint yet (its last status is then "started").
    failed = [status for status in statuses if status.state == "failed"]
    assert failed, statuses
    for status in failed:
        assert "cannot resume" in status.error
        assert "Traceback (most recent call last):" in status.traceback
        assert "_load_checkpoint" in status.traceback


ENDS = {
    "raise": ("raise ValueError('bad batch')", 1, "failed", "ValueError: bad batch"),
    "exit 3": ("sys.exit(3)", 3, "failed", "SystemExit: 3"),
    "exit message": ("sys.exit('no data')", 1, "failed", "no data"),
    "exit 0": ("sys.exit(0)", 0, "finished", None),
    "end": ("pass", 0, "finished", None),
}


@pytest.mark.parametrize("how", list(ENDS))
def test_the_rank_entry_reports_how_the_script_ended(tmp_path, how):
    """What torchrun runs for each rank (and mp.spawn's function runs the same code)."""
    line, code, state, error = ENDS[how]
    script = tmp_path / "ends.py"
    script.write_text(f"import sys\nimport ddptui\nddptui.log(loss=1.0)\n{line}\n")
    with Collector("ends", world_size=2) as collector:
        env = {
            **os.environ,
            "DDPTUI_ENDPOINT": collector.endpoint,
            "DDPTUI_RUN_ID": "ends",
            "RANK": "1",
            "LOCAL_WORLD_SIZE": "2",
        }
        cmd = [sys.executable, "-m", "ddptui.rank.entry", "--script", str(script)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        events = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(
            type(e).__name__ == "Status" and e.state != "started" for e in events
        ):
            events += collector.poll(0.1)
    assert proc.returncode == code, proc.stderr
    status = final_status(events, 1)
    assert (status.state, status.error) == (state, error)
    if error is None:
        assert status.traceback is None
    else:
        assert status.traceback.startswith("Traceback (most recent call last):")
        assert line in status.traceback
        assert proc.stderr.count("Traceback (most recent call last):") <= 1  # printed once
