"""No process of a run outlives ddptui, however ddptui ends, even while ranks are starting."""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

import psutil
import pytest

from ddptui.run.launcher import Launcher
from tests.helpers import USER_SCRIPT, processes_of_run, wait_until

pytestmark = pytest.mark.slow
#: Ranks must be gone within 5 s of ddptui's death; allow for a loaded test machine.
GONE_WITHIN_S = 10.0


@pytest.fixture(autouse=True)
def own_temp_dirs(monkeypatch):
    """The processes these tests start get a temporary folder of their own, removed after the
    test: a driver or ddptui killed with SIGKILL cannot remove torchrun's log directory
    (``torchelastic_*``) or ddptui's trace sockets' directory, which went into /tmp at every
    run of the suite. Short (under /tmp), as a socket's path must be."""
    folder = tempfile.mkdtemp(prefix="ddptui-test-", dir="/tmp")
    monkeypatch.setenv("TMPDIR", folder)
    monkeypatch.setenv("XDG_RUNTIME_DIR", folder)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def start_ddptui(run_dir, launcher):
    cmd = [
        sys.executable,
        "-m",
        "ddptui.cli",
        "--no-ui",
        "--launcher",
        launcher,
        "--world-size",
        "2",
        "--script",
        str(USER_SCRIPT),
        "--run-dir",
        str(run_dir),
        "--",
        "--steps",
        "100000",
        "--sleep",
        "0.01",
    ]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def kill_run(run_id):
    for proc in processes_of_run(run_id):
        try:
            proc.kill()
        except psutil.Error:
            pass


def has_step(run_dir) -> bool:
    """Whether a step event reached the run's events so far (the last line may be half
    written; other events name fields such as ``steps_per_epoch``, so match the kind)."""
    path = run_dir / "events.jsonl"
    if not path.exists():
        return False
    for line in path.read_text().splitlines():
        try:
            if json.loads(line).get("kind") == "step":
                return True
        except ValueError:
            continue
    return False


def is_rank(proc):
    """A rank process, however far it has got (an mp.spawn child is a multiprocessing
    child until it runs the rank; a torchrun worker runs ddptui.rank.entry from the start)."""
    try:
        cmdline = " ".join(proc.cmdline())
    except psutil.Error:
        return False
    return "ddptui.rank.entry" in cmdline or "spawn_main" in cmdline


@pytest.mark.parametrize(
    "sig, launcher",
    [
        (signal.SIGKILL, "spawn"),
        (signal.SIGKILL, "torchrun"),
        (signal.SIGTERM, "spawn"),
        (signal.SIGTERM, "torchrun"),
        (signal.SIGINT, "torchrun"),  # ddptui's own teardown, like SIGTERM but exit 130
    ],
    ids=["SIGKILL-spawn", "SIGKILL-torchrun", "SIGTERM-spawn", "SIGTERM-torchrun", "SIGINT"],
)
def test_ddptui_signalled_while_ranks_start_leaves_no_process(tmp_path, launcher, sig):
    run_dir = tmp_path / "run"
    proc = start_ddptui(run_dir, launcher)
    run_id = None
    try:
        config = wait_until(lambda: (run_dir / "config.json").exists(), 60)
        assert config, "ddptui never wrote its config"
        run_id = json.loads((run_dir / "config.json").read_text())["run_id"]
        # Signal as soon as the rank processes exist: they are still importing torch.
        starting = wait_until(
            lambda: [p for p in processes_of_run(run_id) if is_rank(p)], 60, interval=0.02
        )
        assert starting, "no rank process ever started"
        assert not has_step(run_dir), "ranks were already training: not start-up any more"
        os.kill(proc.pid, sig)
        proc.wait(timeout=30)
        gone = wait_until(lambda: processes_of_run(run_id) == [], GONE_WITHIN_S, interval=0.1)
        assert gone, [" ".join(p.cmdline()) for p in processes_of_run(run_id)]
        if sig != signal.SIGKILL:  # ddptui's own teardown: exit 128+N, the run recorded
            assert proc.returncode == 128 + sig
            summary = json.loads((run_dir / "summary.json").read_text())
            assert summary["outcome"] == "interrupted" and summary["exit_code"] == 128 + sig
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if run_id is not None:
            kill_run(run_id)


@pytest.mark.parametrize("launcher", ["spawn", "torchrun"])
def test_ranks_follow_a_driver_killed_while_they_start(tmp_path, launcher):
    """The ranks notice by themselves: ddptui (here, this test) does nothing about it."""
    run_id = f"driver-death-{launcher}"
    run = Launcher(
        launcher,
        2,
        tmp_path,
        run_id,
        endpoint=None,
        script=str(USER_SCRIPT),
        args=["--steps", "100000", "--sleep", "0.01"],
    )
    run.start()
    try:
        starting = wait_until(
            lambda: [p for p in processes_of_run(run_id) if is_rank(p)], 60, interval=0.02
        )
        assert starting, "no rank process ever started"
        os.kill(run.pid, signal.SIGKILL)
        gone = wait_until(lambda: processes_of_run(run_id) == [], GONE_WITHIN_S, interval=0.1)
        assert gone, [" ".join(p.cmdline()) for p in processes_of_run(run_id)]
        result = run.poll()
        assert result is not None and result.exit_code == -signal.SIGKILL
    finally:
        run.stop(grace=1.0)
        kill_run(run_id)


STRAY = """
import multiprocessing as mp, sys, time

def wait():
    time.sleep(60)

if __name__ == "__main__":
    mp.set_start_method("spawn")
    mp.Process(target=wait).start()
    print("started", flush=True)
    time.sleep(60)
"""


def _cmdline(process: psutil.Process) -> list[str]:
    with contextlib.suppress(psutil.Error, OSError):
        return process.cmdline()
    return []


def test_the_processes_still_running_are_named_by_their_script_or_their_parent(tmp_path):
    """What a lingering note names: a script's process by its file, a spawned
    ``multiprocessing`` child by its parent; zombies and the resource tracker are left out."""
    script = tmp_path / "main.py"
    script.write_text(STRAY)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "started"
        tree = psutil.Process(proc.pid).children(recursive=True)
        # a spawn start() returns without waiting for the child's exec (until it is done, the
        # child's command line is its parent's, then for a moment none): read it after
        assert wait_until(
            lambda: all("multiprocessing" in " ".join(_cmdline(p)) for p in tree), 30, interval=0.05
        )
        launcher = Launcher.__new__(Launcher)  # only its processes matter here
        launcher._run_processes = lambda: {p.pid: None for p in [psutil.Process(proc.pid), *tree]}
        running = launcher.still_running()
        kinds = {what for _, what in running}
        assert kinds == {"main.py", f"a multiprocessing child of {proc.pid}"}, running
        assert [pid for pid, _ in running] == sorted(pid for pid, _ in running)
    finally:
        for p in [*psutil.Process(proc.pid).children(recursive=True), proc]:
            with contextlib.suppress(psutil.Error, OSError):
                p.kill()
        proc.wait(10)


def test_a_process_in_its_exec_is_named_by_its_program(monkeypatch):
    """A process with no command line to read (a multiprocessing child in its exec, read the
    moment its parent's start() returned on a loaded machine) is named by its program, not
    "?"."""
    me = psutil.Process()
    monkeypatch.setattr(psutil.Process, "cmdline", lambda self: [])
    launcher = Launcher.__new__(Launcher)
    launcher._run_processes = lambda: {me.pid: None}
    assert launcher.still_running() == [(me.pid, me.name())]
