"""The ddptui command starts a headless torchrun run's driver before loading its front end
(ddptui.run.prestart): which command lines get one, and that one nobody takes is gone with
ddptui. The real-world tier runs every one of its torchrun runs through it."""

import subprocess
import sys

import pytest

from ddptui.run import prestart
from tests.helpers import USER_SCRIPT, read_events, wait_until


@pytest.mark.parametrize(
    "argv, wanted",
    [
        (["--no-ui", "--script", "train.py"], True),
        (["--no-ui", "--script=train.py", "--world-size", "2"], True),
        (["--no-ui", "--launcher", "torchrun", "--world-size", "2"], True),
        (["--no-ui", "--launcher=torchrun"], True),
        (["--no-ui", "--script", "train.py", "--launcher", "spawn"], False),
        (["--no-ui", "--script", "train.py", "--launcher", "slurm"], False),
        (["--no-ui"], False),  # the built-in trainer: mp.spawn by default
        (["--script", "train.py"], False),  # the dashboard: the user may change everything
        (["--no-ui", "--script", "train.py", "--help"], False),
        (["--no-ui", "--script", "t.py", "--print-sbatch"], False),
        (["monitor", "--no-ui"], False),
        (["join", "--no-ui", "--script", "t.py"], False),
        (["--no-ui", "--", "--script", "x", "--launcher", "torchrun"], False),  # the script's
        ([], False),
    ],
)
def test_which_command_lines_start_the_driver_first(argv, wanted):
    assert prestart.wanted(argv) is wanted


def prestarted_drivers() -> list[int]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [int(line.split()[0]) for line in out.splitlines() if prestart.PRESTARTED in line]


def test_a_usage_error_leaves_no_driver_behind(tmp_path):
    before = set(prestarted_drivers())
    for args in (["--world-size", "0"], ["--world-size", "1e400"], ["--run-dir", "/proc/x/y"]):
        proc = subprocess.run(
            [sys.executable, "-m", "ddptui.console", "--no-ui", "--script", str(USER_SCRIPT)]
            + args,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith("ddptui: error:") and "Traceback" not in proc.stderr
    assert wait_until(lambda: set(prestarted_drivers()) <= before, 10), prestarted_drivers()


def test_the_driver_started_first_runs_the_run_and_goes_with_it(tmp_path):
    """A real torchrun run through the ddptui command: its driver is the prestarted one
    (named by ddptui's pid in its environment), the ranks report, nothing is left."""
    from tests.helpers import prestarted_by

    proc = subprocess.Popen(
        [sys.executable, "-m", "ddptui.console", "--no-ui", "--script", str(USER_SCRIPT)]
        + ["--world-size", "1", "--run-dir", str(tmp_path / "run"), "--", "--steps", "3"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        drivers = wait_until(lambda: prestarted_by(proc.pid), 30, interval=0.02)
        assert drivers, "no driver was started first"
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for driver in prestarted_by(proc.pid):
            driver.kill()
    assert proc.returncode == 0, err
    assert "finished" in out
    steps = [e for e in read_events(tmp_path / "run") if e["kind"] == "step"]
    assert len(steps) == 3  # the ranks had the run's environment: telemetry reached ddptui
    assert wait_until(lambda: not prestarted_by(proc.pid), 10)


def test_take_without_a_prestarted_driver_says_start_one():
    prestart.cancel()
    assert prestart.take(["torchrun"], {}, "/nonexistent/log") is None
