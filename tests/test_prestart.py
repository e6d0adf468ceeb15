"""The ddptui command starts a headless torchrun run's driver before loading its front end
(ddptui.run.prestart): which command lines get one, and that one nobody takes is gone with
ddptui. The real-world tier runs every one of its torchrun runs through it (each run's
launcher.log must say so), and its leftover check covers that driver by ddptui's pid."""

import subprocess
import sys

import pytest

from ddptui.run import prestart
from tests.helpers import USER_SCRIPT, prestarted_by, wait_until


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


@pytest.mark.parametrize(
    "args", [["--world-size", "0"], ["--world-size", "1e400"], ["--run-dir", "/proc/x/y"]]
)
def test_a_usage_error_leaves_no_driver_behind(args):
    """ddptui started the driver before judging the options; the error ends it too."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "ddptui.console", "--no-ui", "--script", str(USER_SCRIPT), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 2, err
    assert err.startswith("ddptui: error:") and "Traceback" not in err
    assert wait_until(lambda: not prestarted_by(proc.pid), 10), prestarted_by(proc.pid)


def test_take_without_a_prestarted_driver_says_start_one():
    prestart.cancel()
    assert prestart.take(["torchrun"], {}, "/nonexistent/log") is None
