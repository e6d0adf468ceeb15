"""``ddptui attach``: follow a run another ddptui process owns, list the live runs."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from ddptui.constants import RUN_ID_ENV
from ddptui.runs import attach
from ddptui.runs import live as liveruns
from ddptui.tui import follow
from ddptui.tui.follow import FollowSource
from tests.data_fixtures.record import RUNS
from tests.helpers import ROOT, processes_of_run, wait_until

RECORDED = RUNS / "amp-off"


def _growing_run(tmp_path, name="live"):
    """A run directory with the recorded config, no events yet; returns (dir, event lines)."""
    run = tmp_path / name
    run.mkdir(parents=True)
    shutil.copy(RECORDED / "config.json", run / "config.json")
    (run / "events.jsonl").write_bytes(b"")
    lines = (RECORDED / "events.jsonl").read_bytes().splitlines(keepends=True)
    return run, lines


def _append(run, data: bytes) -> None:
    with open(run / "events.jsonl", "ab") as f:
        f.write(data)


def test_follows_a_growing_file_and_waits_for_half_written_lines(tmp_path):
    run, lines = _growing_run(tmp_path)
    source = FollowSource(run, alive=lambda run_id: True)
    assert source.poll() == 0 and source.running
    _append(run, b"".join(lines[:20]))
    assert source.poll() == 20
    steps = {r: v.step for r, v in source.state.ranks.items()}
    assert max(steps.values()) > 0
    half = len(lines[20]) // 2
    _append(run, lines[20][:half])  # the writer is mid-line
    assert source.poll() == 0
    _append(run, lines[20][half:] + b"".join(lines[21:]))
    assert source.poll() == len(lines) - 20
    assert source.state.events_applied == len(lines) and source.skipped_lines == 0
    assert max(v.step for v in source.state.ranks.values()) > max(steps.values())
    assert source.running and source.state.outcome is None
    shutil.copy(RECORDED / "summary.json", run / "summary.json")
    source.poll()
    assert not source.running
    assert source.state.outcome == "finished"
    assert source.ended == "the run has ended: finished"
    assert "attached: the run has ended" in source.note
    # Times are the events' own: elapsed spans the run, not the time since attaching.
    times = [json.loads(line)["t"] for line in lines]
    assert source.state.elapsed(source.now()) == pytest.approx(max(times) - min(times))


def test_a_run_whose_processes_vanish_without_summary_is_called_lost(tmp_path, monkeypatch):
    monkeypatch.setattr(follow, "LOST_GRACE_S", 0.0)
    run, lines = _growing_run(tmp_path)
    _append(run, b"".join(lines[:30]))
    source = FollowSource(run, alive=lambda run_id: False)
    source.poll()
    assert not source.running
    assert "processes are gone and it wrote no summary.json" in source.ended
    assert source.state.outcome == "interrupted"  # derived from the events, as replay does


def test_events_of_another_run_and_garbage_are_skipped(tmp_path):
    run, lines = _growing_run(tmp_path)
    other = json.loads(lines[2])
    other["run"] = "someone-else"
    _append(run, lines[0] + b"not json\n" + json.dumps(other).encode() + b"\n" + lines[1])
    source = FollowSource(run, alive=lambda run_id: True)
    assert source.poll() == 2
    assert source.skipped_lines == 1


def test_follower_thread_stops_on_close(tmp_path):
    run, lines = _growing_run(tmp_path)
    source = FollowSource(run, alive=lambda run_id: True).start()
    _append(run, b"".join(lines[:10]))
    assert wait_until(lambda: source.state.events_applied == 10, 5)
    source.close()
    assert not source._thread.is_alive()


def test_alive_run_ids_sees_a_process_carrying_the_id():
    run_id = f"attach-test-{os.getpid()}"
    proc = subprocess.Popen(["sleep", "30"], env={**os.environ, RUN_ID_ENV: run_id})
    try:
        assert wait_until(lambda: liveruns.run_is_alive(run_id), 5)
        assert run_id in liveruns.alive_run_ids()
    finally:
        proc.kill()
        proc.wait()
    assert not liveruns.run_is_alive(run_id)


def test_attach_without_argument_lists_live_runs(tmp_path, monkeypatch, capsys):
    root = tmp_path / "runs"
    live, _ = _growing_run(root, "live-one")
    nested, _ = _growing_run(root / "bench-1", "01-w1")
    done, _ = _growing_run(root, "done")
    shutil.copy(RECORDED / "summary.json", done / "summary.json")
    ghost, _ = _growing_run(root, "ghost")  # no summary, but no process either
    for path, run_id in ((live, "id-live"), (nested, "id-nested"), (ghost, "id-ghost")):
        config = json.loads((path / "config.json").read_text())
        config["run_id"] = run_id
        (path / "config.json").write_text(json.dumps(config))
    assert {e.path.name for e in liveruns.unfinished_runs(root)} == {"live-one", "01-w1", "ghost"}
    monkeypatch.setattr(liveruns, "alive_run_ids", lambda wanted=None: {"id-live", "id-nested"})
    monkeypatch.chdir(tmp_path)
    assert attach.main([]) == 0
    out = capsys.readouterr().out
    assert "runs/live-one" in out and "runs/bench-1/01-w1" in out
    assert "ghost" not in out and "done" not in out
    assert "synthetic x2 (spawn, gloo, amp off)" in out
    monkeypatch.setattr(liveruns, "alive_run_ids", lambda wanted=None: set())
    assert attach.main([]) == 0
    assert capsys.readouterr().out == "no live runs under runs/\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["/no/such/run"], "not a run directory (no events.jsonl): /no/such/run"),
        (["a", "b"], "unrecognized arguments: b"),
    ],
)
def test_bad_input_one_line_exit_2(argv, message, capsys):
    assert attach.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ddptui: error: ")
    assert message in err


def test_broken_config_is_one_line(tmp_path, capsys):
    run, _ = _growing_run(tmp_path)
    (run / "config.json").write_text("[1, 2")
    assert attach.main([str(run)]) == 2
    assert "is not valid JSON" in capsys.readouterr().err


# -- a real headless run, attached from the dashboard --------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_attach_sees_a_headless_run_advance_and_end(tmp_path):
    from ddptui.tui.attach_app import AttachApp
    from ddptui.tui.screens.attach import AttachScreen
    from tests.tui_fixtures.fakes import fake_deps, no_gpu_snapshots

    run_dir = tmp_path / "runs" / "bg"
    run_id = f"attach-bg-{os.getpid()}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    # The run id is chosen through the run directory's config only; find it from there.
    proc = subprocess.Popen(
        [sys.executable, "-m", "ddptui.cli", "--no-ui", "--epochs", "2", "--world-size", "2"]
        + ["--backend", "gloo", "--run-dir", str(run_dir), "--", "--train-size", "6000"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        assert wait_until(lambda: (run_dir / "events.jsonl").exists(), 60)
        run_id = json.loads((run_dir / "config.json").read_text())["run_id"]
        source = FollowSource(run_dir)
        app = AttachApp(source, deps=fake_deps(no_gpu_snapshots()))
        seen: set[int] = set()
        async with app.run_test(size=(120, 40)) as pilot:
            # Bounded by the clock, not by a count of pauses: on a loaded CI machine each pause
            # and frame takes longer and the run itself too (a count of 400 ran out at 72 s).
            deadline = time.monotonic() + 200
            while time.monotonic() < deadline:
                await pilot.pause(0.1)
                screen = app.screen
                if isinstance(screen, AttachScreen) and screen.frame is not None:
                    steps = [int(r.epoch_step.split("/")[1]) for r in screen.frame.rows]
                    if source.running and min(steps) > 0:
                        seen.add(min(steps))
                if not source.running and screen.frame and screen.frame.status != "running":
                    break
            assert len(seen) >= 2, f"steps seen while running: {sorted(seen)}"
            assert source.ended == "the run has ended: finished", f"run exit {proc.poll()}"
            await pilot.pause(0.5)
            screen = app.screen
            assert screen.frame.status == "finished"
            assert all(r.state == "finished" for r in screen.frame.rows)
            header = str(screen.query_one("#run-title").render())
            assert "FINISHED" in header and "attached: the run has ended" in header
            await pilot.press("s")  # stop belongs to the owner: it says so
            await pilot.pause()
            assert any("belongs to another ddptui" in str(n.message) for n in app._notifications)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for leftover in processes_of_run(run_id):
            leftover.kill()
    assert not processes_of_run(run_id)
