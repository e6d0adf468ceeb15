"""A live run's directory under attack (issue 23): deleted mid-run, its disk full, its
checkpoint unwritable. Each case says what happened in one line and fails the run (exit 1);
nothing on disk is torn. Two small real runs (synthetic trainer, world size 2, cleaned up)."""

from __future__ import annotations

import errno
import json
import shutil
import time

import pytest

from ddptui import protocol
from ddptui.run.config import build_config
from ddptui.run.diagnosis import rank_ends
from ddptui.run.launcher import LaunchResult
from ddptui.run.session import RunSession
from ddptui.run.state import RankFailureInfo
from ddptui.runfiles import RunDir
from tests.helpers import processes_of_run
from tests.test_safeio import small_tmpfs

SMALL = ("--train-size", "3000", "--test-size", "200")


def _cfg(run_dir, epochs=3):
    return build_config(
        {"run_dir": str(run_dir), "epochs": str(epochs), "world_size": "2", "script_args": SMALL}
    )


def _events_on_disk(run_dir) -> int:
    try:
        return RunDir(run_dir).events.read_bytes().count(b"\n")
    except OSError:
        return 0


@pytest.mark.slow
def test_a_run_directory_deleted_mid_run_fails_the_run_and_is_not_recreated(tmp_path):
    run_dir = tmp_path / "run"
    cfg = _cfg(run_dir)
    session = RunSession(cfg)
    try:
        session.start()
        deadline = time.monotonic() + 120
        while _events_on_disk(run_dir) < 30 and time.monotonic() < deadline:
            assert session.poll() is None, "the run ended before it could be deleted"
            session.pump(0.1)
        shutil.rmtree(run_dir)
        while session.poll() is None and time.monotonic() < deadline:
            session.pump(0.1)
        assert session.result is not None and processes_of_run(cfg.run_id) == []
    finally:
        session.close()
    assert session.outcome == "failed" and session.exit_code == 1
    assert session.fault is not None and "\n" not in session.fault
    assert f"run directory {run_dir} was deleted while the run was live" in session.fault
    assert "config.json, events.jsonl gone" in session.fault
    assert not RunDir(run_dir).summary.exists()  # no directory made up of a summary alone


@pytest.mark.slow
def test_a_full_disk_mid_run_leaves_only_whole_lines(tmp_path):
    with small_tmpfs(tmp_path / "disk", size="200k") as disk:
        (disk / "ballast").write_bytes(b"\0" * 150_000)  # about 50 KB left: events fill it
        run_dir = disk / "run"
        cfg = _cfg(run_dir, epochs=1)
        session = RunSession(cfg)
        try:
            session.start()
            deadline = time.monotonic() + 120
            while session.poll() is None and time.monotonic() < deadline:
                session.pump(0.1)
            assert session.result is not None and processes_of_run(cfg.run_id) == []
        finally:
            session.close()
        assert session.outcome == "failed" and session.exit_code == 1
        assert "ENOSPC" in session.state.failure.describe()
        data = RunDir(run_dir).events.read_bytes()
        assert data.endswith(b"\n")
        assert all(protocol.from_json(line) for line in data.splitlines())


def test_a_checkpoint_on_a_full_disk_names_enospc_and_the_file(tmp_path):
    import torch

    from trainers.checkpoint import save_atomic

    with small_tmpfs(tmp_path / "disk", size="64k") as disk:
        with pytest.raises(OSError) as info:
            save_atomic({"w": torch.zeros(100_000)}, disk / "checkpoint.pt")
        assert info.value.errno == errno.ENOSPC
        assert "(ENOSPC)" in str(info.value) and ".checkpoint.pt." in str(info.value)
        assert list(disk.iterdir()) == []  # the temp file is gone


def test_a_ranks_own_error_is_the_cause_not_the_drivers_exit(tmp_path):
    """Read-only run directory: rank 0 fails on its checkpoint temp file and the driver dies
    writing its record; the failure shown is rank 0's error, with rank 0's log."""
    session = RunSession(_cfg(tmp_path / "run"))
    (tmp_path / "run").mkdir()
    RunDir(tmp_path / "run").rank_log(0).write_text("OSError: [Errno 30] Read-only file system\n")
    error = "OSError: [Errno 30] Read-only file system: '/r/.checkpoint.pt.7.tmp'"
    for rank, state in ((0, "failed"), (1, "started")):
        session.state.apply(
            protocol.Status(run=session.cfg.run_id, rank=rank, t=1.0, seq=0, state=state)
            if state != "failed"
            else protocol.Status(
                run=session.cfg.run_id, rank=rank, t=1.0, seq=0, state=state, error=error
            )
        )
    cause = session._rank_cause(RankFailureInfo(rank=None, exit_code=1, stderr_tail=("driver",)))
    assert cause.rank == 0 and cause.error == error
    assert cause.stderr_tail == ("OSError: [Errno 30] Read-only file system",)
    assert "rank 0" in cause.describe() and "launcher" not in cause.describe()
    signalled = RankFailureInfo(rank=None, signal="SIGKILL")
    assert session._rank_cause(signalled) is signalled  # a kill is its own cause


def _spawned_run(tmp_path, worker_states):
    """A run launched as one process (pid 100, rank 0) whose mp.spawn workers (pids 200 +
    rank) took over ranks 0 and 1 and ended as ``worker_states`` says (rank -> state, error)."""
    session = RunSession(_cfg(tmp_path / "run"))
    (tmp_path / "run").mkdir(parents=True)
    RunDir(tmp_path / "run").rank_log(0).write_text("ProcessRaisedException: Process 2 ...\n")
    run = session.cfg.run_id
    session.state.apply(protocol.Status(run=run, rank=0, t=1.0, seq=0, state="started", pid=100))
    for rank, (state, error) in worker_states.items():
        for seq, now in enumerate(("started", state)):
            session.state.apply(
                protocol.Status(
                    run=run, rank=rank, t=2.0, seq=seq, state=now, pid=200 + rank, world_size=2,
                    error=error if now == "failed" else None,
                )
            )  # fmt: skip
    return session


def test_a_spawner_that_fails_is_not_the_rank_its_worker_took_over(tmp_path):
    """The launcher records the process it launched as rank 0 (pid 100) exiting with 1; its
    worker that became rank 0 (pid 200) ended well. The failure is the script's process, not
    rank 0's: rank 0 stays finished, no crash names it (pytorch/examples' ddp_rpc with its
    RPC master failing, or a spawner whose own last line raises)."""
    session = _spawned_run(tmp_path, {0: ("finished", None), 1: ("finished", None)})
    launched = RankFailureInfo(rank=0, exit_code=1, pid=100, stderr_tail=("x",))
    cause = session._rank_cause(launched)
    assert cause.spawner and cause.rank == 0 and cause.stderr_tail == ("x",)
    assert cause.describe().startswith("the script's process (launched as rank 0; its workers")
    session.state.set_outcome("failed", cause)
    assert {r: v.state for r, v in session.state.ranks.items()} == {0: "finished", 1: "finished"}
    assert rank_ends(session.state) == []
    # the same record of a rank's own process (pid 200) is that rank's failure
    own = RankFailureInfo(rank=0, exit_code=1, pid=200)
    assert session._rank_cause(own) is own
    # a spawner killed outright is its own cause, whatever its workers said after
    session.state.ranks[1].state, session.state.ranks[1].error = "failed", "RuntimeError: peer"
    killed = session._rank_cause(RankFailureInfo(rank=0, signal="SIGKILL", pid=100))
    assert killed.spawner and killed.rank == 0 and killed.signal == "SIGKILL"


def test_a_spawned_workers_own_error_is_the_cause_not_the_spawners_exit(tmp_path):
    """mp.spawn's worker 1 raised: it says so itself, and the spawner's exit code (launched
    as rank 0) is not rank 0's failure. It read "rank 0 failed first: exit code 1", rank 0
    failed and rank 1 finished."""
    session = _spawned_run(
        tmp_path, {0: ("finished", None), 1: ("failed", "ValueError: worker 1 broke")}
    )
    cause = session._rank_cause(RankFailureInfo(rank=0, exit_code=1, pid=100))
    assert (cause.rank, cause.error, cause.spawner) == (1, "ValueError: worker 1 broke", False)
    session.state.set_outcome("failed", cause)
    assert {r: v.state for r, v in session.state.ranks.items()} == {0: "finished", 1: "failed"}
    assert [e.rank for e in rank_ends(session.state)] == [1]


def test_a_spawner_whose_workers_failed_before_their_group_is_named_by_its_logs_error(
    tmp_path,
):
    """rasbt/LLMs-from-scratch's DDP-script.py on a host without CUDA: the mp.spawn workers
    raised in ``init_process_group(backend="nccl")``, before they were ranks, so no rank said
    why; the spawner (muted) raised mp.spawn's error and exited 1. It read "rank 0 failed
    first: exit code 1"; the error its log ends with names it now."""
    session = _spawned_run(tmp_path, {})
    tail = (
        "torch.multiprocessing.spawn.ProcessRaisedException:",
        "-- Process 0 terminated with the following error:",
        "Traceback (most recent call last):",
        '  File "/x/distributed_c10d.py", line 833, in _nccl2_device',
        '    raise RuntimeError("nccl2 requires at least one CUDA device")',
        "RuntimeError: nccl2 requires at least one CUDA device",
    )
    launched = RankFailureInfo(rank=0, exit_code=1, pid=100, stderr_tail=tail)
    cause = session._rank_cause(launched)
    assert (cause.rank, cause.error) == (0, "RuntimeError: nccl2 requires at least one CUDA device")
    assert cause.describe() == f"rank 0 exited with code 1: {cause.error}"
    # a log that does not end with a traceback's error, a kill, an error said: as they were
    for failure in (
        RankFailureInfo(rank=0, exit_code=1, pid=100, stderr_tail=(*tail, "bye")),
        RankFailureInfo(rank=0, signal="SIGKILL", pid=100, stderr_tail=tail),
        RankFailureInfo(rank=0, exit_code=1, pid=100, error="ValueError: x", stderr_tail=tail),
    ):
        assert session._rank_cause(failure).error == failure.error


def test_a_worker_failed_on_its_lost_peer_is_not_the_cause(tmp_path):
    """Rank 0 failed too, on the peer it lost (before mp.spawn's teardown reached it): the
    first rank to fail of its own is the cause, not the lowest rank that said anything."""
    lost = "RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer"
    session = _spawned_run(
        tmp_path, {0: ("failed", lost), 1: ("failed", "ValueError: worker 1 broke")}
    )
    cause = session._rank_cause(RankFailureInfo(rank=0, exit_code=1, pid=100))
    assert (cause.rank, cause.error) == (1, "ValueError: worker 1 broke")


def test_ranks_that_said_they_failed_fail_a_run_whose_launcher_ended_well(tmp_path):
    """The script joined its workers without a look at their exit codes (the distributed
    tutorial's Process per rank) and exited 0; its ranks said they failed. The run failed,
    named by the rank that failed of its own; before, it ended ``finished``, exit 0."""
    lost = "RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer"
    session = _spawned_run(
        tmp_path, {0: ("failed", lost), 1: ("failed", "ValueError: worker 1 broke")}
    )
    session._conclude(LaunchResult(exit_code=0), drain=False)
    assert (session.outcome, session.exit_code) == ("failed", 1)
    failure = session.state.failure
    assert (failure.rank, failure.error) == (1, "ValueError: worker 1 broke")
    assert [d.rank for d in session.diagnoser.diagnoses if d.cause == "crash"] == [1]
    # ranks that all ended well: the run finished, as before
    well = _spawned_run(tmp_path / "well", {0: ("finished", None), 1: ("finished", None)})
    well._conclude(LaunchResult(exit_code=0), drain=False)
    assert (well.outcome, well.exit_code, well.state.failure) == ("finished", 0, None)
    # the user's stop wins over what the ranks said while torn down
    stopped = _spawned_run(tmp_path / "stop", {1: ("failed", "ValueError: worker 1 broke")})
    stopped._conclude(LaunchResult(exit_code=0, stopped=True), drain=False)
    assert stopped.outcome == "stopped"


def test_the_summary_of_a_run_names_a_seq_jump(tmp_path):
    from ddptui.run.rundir import summarize

    session = RunSession(_cfg(tmp_path / "run"))
    for seq in (0, 1, 1_000_000):
        session.state.apply(
            protocol.Step(run=session.cfg.run_id, rank=0, t=1.0, seq=seq, epoch=1, step=seq)
        )
    doc = json.loads(json.dumps(summarize(session.state, "finished")))
    assert doc["events"]["seq_jumps"] == [{"rank": 0, "from": 1, "to": 1_000_000}]
    assert session.state.dropped == 1


def test_a_run_directory_deleted_after_the_last_event_still_fails_the_run(tmp_path):
    from ddptui import safeio
    from ddptui.run.launcher import LaunchResult

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    session = RunSession(_cfg(run_dir))
    session._events_file = safeio.LineAppender(RunDir(run_dir).events)
    session.result = LaunchResult(0)
    session.state.set_outcome("finished")
    shutil.rmtree(run_dir)
    session.close()
    assert session.outcome == "failed" and session.exit_code == 1
    assert "was deleted while the run was live (config.json, events.jsonl gone)" in session.fault
    assert not run_dir.exists()
