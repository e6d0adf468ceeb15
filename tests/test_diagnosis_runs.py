"""Diagnosis end to end: an unmodified DDP script (no ddptui import) run through ddptui under
both launchers, with injected faults: an input straggler, a compute straggler and a hang.
Real ranks, gloo, CPU. A crash's diagnosis is checked on the real-world tier's ``trainer_raise``
run (tests/test_realworld.py), which is the same fault in another script."""

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddptui.constants import PHASES
from ddptui.run.diagnosis import classify_stack, find_straggler
from ddptui.run.rundir import iter_events
from ddptui.run.state import RunState
from tests.helpers import ROOT, processes_of_run, read_events, step_numbers

pytestmark = pytest.mark.slow

PLAIN = ROOT / "tests" / "scripts" / "plain_ddp.py"


def ddptui_run(run_dir, launcher, env, *args, timeout=150):
    """``ddptui --no-ui --script plain_ddp.py`` with 2 ranks; leaves no process behind."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    cmd = [sys.executable, "-m", "ddptui.cli", "--no-ui", "--script", str(PLAIN)]
    cmd += ["--world-size", "2", "--launcher", launcher, "--run-dir", str(run_dir), *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env)
    finally:
        run_id = json.loads((Path(run_dir) / "config.json").read_text())["run_id"]
        leftovers = processes_of_run(run_id)
        for p in leftovers:
            p.kill()
    assert leftovers == [], "the run left processes behind"
    return proc, json.loads((Path(run_dir) / "summary.json").read_text())


def replayed(run_dir):
    state = RunState("replay", 2)
    for event in iter_events(run_dir):
        state.apply(event)
    return state


def check_live_steps(run_dir, steps_per_rank):
    steps = [e for e in read_events(run_dir) if e["kind"] == "step"]
    for rank in (0, 1):
        mine = [e for e in steps if e["rank"] == rank]
        assert step_numbers(mine) == list(range(1, steps_per_rank + 1))
        for e in mine:
            assert set(PHASES) <= set(e["phases"])
            # a few steps under MERGE_BELOW_S go as one event (on a fast machine, rank 0's
            # steps waiting 4-5 ms on the slow rank did): 16 samples each
            assert e["samples"] == 16 * e["steps"] and e["epoch"] == 1
            assert e["loss"] is not None
            assert sum(e["phases"][p] for p in PHASES) == pytest.approx(e["step_time"], rel=1e-6)


def test_input_straggler_under_torchrun(tmp_path):
    env = {
        "PLAIN_EPOCHS": "1",
        "PLAIN_STEPS": "30",
        "PLAIN_SLOW_DATA_RANK": "1",
        "PLAIN_SLOW_DATA_S": "0.05",
    }
    proc, summary = ddptui_run(tmp_path / "run", "torchrun", env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    check_live_steps(tmp_path / "run", 30)
    found = find_straggler(replayed(tmp_path / "run").phase_history)
    assert (found.rank, found.cause) == (1, "input")
    named = [(d["rank"], d["cause"]) for d in summary["diagnoses"]]
    assert (1, "input") in named and all(rank != 0 for rank, _ in named)
    assert "diagnosis: rank 1 straggler: input (data wait" in proc.stdout
    assert re.search(r"^\s+1\s+\d\d %", proc.stdout, re.M)  # the phase table


def test_compute_straggler_under_spawn(tmp_path):
    env = {
        "PLAIN_EPOCHS": "1",
        "PLAIN_STEPS": "80",
        # rank 1 about 20 ms a step more on a fast machine (40 matmuls and 30 steps made the run
        # 0.15 s of steps there: over before the once-a-second diagnosis looked)
        "PLAIN_SLOW_COMPUTE_RANK": "1",
        "PLAIN_EXTRA_MATMULS": "250",
    }
    proc, summary = ddptui_run(tmp_path / "run", "spawn", env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    check_live_steps(tmp_path / "run", 80)
    found = find_straggler(replayed(tmp_path / "run").phase_history)
    assert (found.rank, found.cause) == (1, "compute")
    assert "backward" in found.detail
    named = [(d["rank"], d["cause"]) for d in summary["diagnoses"]]
    # with the ranks' CPU known, a starved culprit is "host": still rank 1, never rank 0
    assert named and all(r == 1 and c in ("compute", "host") for r, c in named), named


def first_per_rank(diagnoses):
    """Each rank's first diagnosis (the verdict; what the ranks' traces add follows it)."""
    out = {}
    for d in diagnoses:
        out.setdefault(d["rank"], d)
    return out


@pytest.mark.parametrize("thread", [False, True])
def test_hang_is_named_with_stacks_and_torn_down(tmp_path, thread):
    """``thread``: the loop runs in a thread the main thread joins. Its beats and stacks were
    the main thread's: both ranks were "hung outside any collective" at ``trainer.join()``,
    "while no rank waits in a collective", and the trace's line put rank 1 there too."""
    env = {"PLAIN_EPOCHS": "3", "PLAIN_STEPS": "5", "PLAIN_HANG_RANK": "1", "PLAIN_HANG_EPOCH": "2"}
    if thread:
        env["PLAIN_THREAD"] = "1"
    proc, summary = ddptui_run(tmp_path / "run", "spawn", env, "--hang-timeout", "5")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert summary["outcome"] == "hung" and summary["exit_code"] == 3
    assert summary["failure"] is None
    stacks = summary["stacks"]
    assert set(stacks) == {"0", "1"}
    assert "in stall_forever" in stacks["1"]
    assert classify_stack(stacks["0"]).in_collective
    named = first_per_rank(summary["diagnoses"])  # the Flight Recorder's lines come after
    assert named[1]["cause"] == "hang" and "stall_forever (plain_ddp.py:" in named[1]["detail"]
    flight = [d["detail"] for d in summary["diagnoses"] if "never entered" in d["detail"]]
    assert flight and flight[0].startswith("rank 1 never entered all_reduce #"), flight
    assert re.search(r"rank 1 is in stall_forever \(plain_ddp\.py:\d+\)$", flight[0]), flight
    assert named[0]["cause"] == "collective"
    quiet = int(re.search(r"stood still for (\d+) s", named[1]["detail"]).group(1))
    assert 5 <= quiet < 25
    assert "hang: rank 1 hung outside any collective" in proc.stdout
    replay = subprocess.run(
        [sys.executable, "-m", "ddptui.cli", "replay", "--no-ui", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert "hung (exit code 3)" in replay.stdout
    assert "diagnosis: rank 1 hung outside any collective" in replay.stdout


def test_a_rank_waiting_on_an_async_collectives_work_waits_in_a_collective(tmp_path):
    """``dist.all_reduce(t, async_op=True).wait()`` (facebookresearch/pycls all-reduces its
    loss and errors so), rank 1 stopped just before it: rank 0 waits in that wait, C++ beneath
    the script's line. It read "rank 0 hung outside any collective … while no rank waits in a
    collective", and rank 1 the same: two ranks hung on their own where one waits for the
    other."""
    env = {"PLAIN_EPOCHS": "3", "PLAIN_STEPS": "5", "PLAIN_HANG_RANK": "1", "PLAIN_HANG_EPOCH": "2"}
    env["PLAIN_ASYNC_METRIC"] = "1"
    proc, summary = ddptui_run(tmp_path / "run", "spawn", env, "--hang-timeout", "5")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert summary["outcome"] == "hung"
    stack = classify_stack(summary["stacks"]["0"])
    assert (stack.in_collective, stack.collective) == (True, "an async collective's wait()")
    assert stack.where.startswith("main (plain_ddp.py:")
    named = first_per_rank(summary["diagnoses"])
    assert named[0]["cause"] == "collective", summary["diagnoses"]
    assert "rank 1 hung outside any collective" in named[1]["detail"]
    assert "while rank 0 waits in a collective (an async collective's wait())" in proc.stdout
    assert "rank 0 hung outside" not in proc.stdout
    flight = [d["detail"] for d in summary["diagnoses"] if "never entered" in d["detail"]]
    assert flight and flight[0].startswith("rank 1 never entered all_reduce #"), flight


#: What rank 0 moves through the test's FIFO (see :func:`run_with_a_pipe`).
PIPE_BYTES = 10 * 1024 * 1024


def run_with_a_pipe(tmp_path, direction):
    """plain_ddp.py, 2 ranks under spawn, ``--hang-timeout 3``: after its first epoch rank 0
    moves :data:`PIPE_BYTES` through a FIFO at about 1.3 MB/s (64 KiB every 50 ms, the test's
    end of it) while rank 1 waits in a barrier: ``upload`` (rank 0 writes, the test drains)
    or ``download`` (the test feeds, rank 0 reads). The run must finish with no hang."""
    import threading

    fifo = tmp_path / direction
    os.mkfifo(fifo)
    moved = []

    def test_end():
        if direction == "upload":
            with open(fifo, "rb") as pipe:
                while chunk := pipe.read(65536):
                    moved.append(len(chunk))
                    time.sleep(0.05)
            return
        with open(fifo, "wb") as pipe:
            for _ in range(PIPE_BYTES // 65536):
                pipe.write(bytes(65536))
                pipe.flush()
                moved.append(65536)
                time.sleep(0.05)

    thread = threading.Thread(target=test_end, daemon=True)
    thread.start()
    key, where = ("UPLOAD", "TO") if direction == "upload" else ("DOWNLOAD", "FROM")
    env = {
        "PLAIN_EPOCHS": "2",
        "PLAIN_STEPS": "3",
        f"PLAIN_{key}_RANK": "0",
        f"PLAIN_{key}_{where}": str(fifo),
        f"PLAIN_{key}_BYTES": str(PIPE_BYTES),
    }
    try:
        proc, summary = ddptui_run(tmp_path / "run", "spawn", env, "--hang-timeout", "3")
    finally:
        if thread.is_alive():  # the rank never opened it: let the test's end go
            other = os.O_WRONLY if direction == "upload" else os.O_RDONLY
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, other | os.O_NONBLOCK))
        thread.join(10)
    assert sum(moved) == PIPE_BYTES  # the whole checkpoint went
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert summary["outcome"] == "finished"
    assert not [d for d in summary["diagnoses"] if d["cause"] in ("hang", "collective")]


def test_a_rank_0_checkpoint_streamed_to_an_uploader_is_work_not_a_hang(tmp_path):
    """Rank 0 streams its checkpoint to an uploader that drains it at about 1.3 MB/s (a CLI
    sending it to object storage, or an HTTPS transfer) for about 8 s, its main thread
    waiting, its CPU idle, while rank 1 waits in a barrier; the limit is 3 s. It counted as
    no I/O (storage only): the healthy run was torn down as hung. Now what its read and
    write calls pass counts."""
    run_with_a_pipe(tmp_path, "upload")
    beats = [e for e in read_events(tmp_path / "run") if e["kind"] == "beat" and e["rank"] == 0]
    moved = [b["io"] for b in beats if b.get("io") is not None]
    assert moved and moved[-1] - moved[0] >= PIPE_BYTES  # the upload counts as rank 0's I/O


def test_a_rank_reading_inside_a_call_that_keeps_the_gil_works_and_is_not_hung(tmp_path):
    """Rank 0 reads a 10 MB checkpoint fed into a pipe at about 1.3 MB/s in one C call that
    keeps the GIL (as ``import torch`` from a network file system faults its libraries in):
    its beats stop and its CPU idles while rank 1 waits in a barrier; the limit is 3 s. With
    its CPU the only evidence, rank 0 was "heartbeat silent, CPU idle" and the healthy run
    was torn down as hung. Now ddptui's own sample of its I/O shows it works."""
    run_with_a_pipe(tmp_path, "download")
    sent_at = [e["t"] for e in read_events(tmp_path / "run") if e["rank"] == 0]
    silent = max(later - t for t, later in zip(sent_at, sent_at[1:], strict=False))
    assert silent > 4.0, "rank 0 never went silent: the test tests nothing"


def test_ranks_that_train_apart_are_told_and_ddp_or_pipelined_ranks_are_not(tmp_path):
    """pytorch/examples' ImageNet script wraps its model in DDP only on a GPU: on the CPU its
    ranks each trained their own model under ddptui, and nothing said so. The same script
    without its DDP wrap, with it, and without it but passing a tensor from rank 0 to rank 1
    every step (a pipeline's stages; gloo's Flight Recorder records no point-to-point op),
    150 steps a rank, the three at once: the note for the first alone, no verdict for any.
    Under ddptui's spawn launcher: the note does not depend on the launcher, and torchrun's
    agent would cost each run 2 CPU-seconds more (its import of torch).

    And the ranks that train on the same data: the DDP run's DataLoader has no
    DistributedSampler (kubeflow's PyTorch MNIST example: ``shuffle=True``, one seed on every
    rank), and the ranks say so from their first batch's digest (once, no verdict); the run
    apart draws its batches alike too, but holds no DDP module: its ranks send none (a
    tensor-parallel rank draws the same batches by design)."""
    from concurrent.futures import ThreadPoolExecutor

    env = {"PLAIN_EPOCHS": "1", "PLAIN_STEPS": "150", "PLAIN_STEP_S": "0.02"}
    apart = {**env, "PLAIN_NO_DDP": "1", "PLAIN_NO_SAMPLER": "1"}
    runs = {
        "apart": apart,
        "ddp": {**env, "PLAIN_NO_SAMPLER": "1"},
        "p2p": {**apart, "PLAIN_P2P": "1"},
    }
    with ThreadPoolExecutor(len(runs)) as pool:
        futures = {
            name: pool.submit(ddptui_run, tmp_path / name, "spawn", run_env)
            for name, run_env in runs.items()
        }
        summaries = {name: future.result()[1] for name, future in futures.items()}
    for name, summary in summaries.items():
        causes = [d["cause"] for d in summary["diagnoses"]]
        allowed = {"no_comm", "communication", "host", "same_batches"}
        assert set(causes) <= allowed, (name, summary["diagnoses"])
        notes = [d for d in summary["diagnoses"] if d["cause"] == "no_comm"]
        assert len(notes) == (name == "apart"), (name, summary["diagnoses"])
        same = [d for d in summary["diagnoses"] if d["cause"] == "same_batches"]
        assert len(same) == (name == "ddp"), (name, summary["diagnoses"])
    (note,) = [d for d in summaries["apart"]["diagnoses"] if d["cause"] == "no_comm"]
    assert "each trains a model of its own" in note["detail"]
    (same,) = [d for d in summaries["ddp"]["diagnoses"] if d["cause"] == "same_batches"]
    assert same["detail"].startswith("ranks 0 and 1 drew the same first batch")
    digests = [e for e in read_events(tmp_path / "ddp") if e.get("code") == "first_batch"]
    assert sorted(e["rank"] for e in digests) == [0, 1]
    assert not [e for e in read_events(tmp_path / "apart") if e.get("code") == "first_batch"]
