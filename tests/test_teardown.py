"""Teardown signals only processes of the run, checked by identity (pid + create time)."""

import signal
import subprocess
import sys

import psutil
import pytest

from ddptui.run.launcher import Launcher, ProcessIdentity
from tests.helpers import USER_SCRIPT


@pytest.fixture
def stranger():
    """A process that is not part of any run, leading its own process group."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True
    )
    yield proc
    proc.kill()
    proc.wait()


class ReapedDriver:
    """A driver that has exited and been waited for; its pid now belongs to someone else."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode = 0

    def poll(self) -> int:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        return self.returncode

    def send_signal(self, sig: int) -> None:  # Popen never signals a reaped child
        pass


def test_a_reaped_driver_whose_pid_was_reused_is_never_signalled(tmp_path, stranger):
    launcher = Launcher(
        "spawn", 1, tmp_path, "reuse-test", endpoint=None, script=str(USER_SCRIPT), grace=0.5
    )
    launcher.process = ReapedDriver(stranger.pid)  # as if the pid had been reused
    result = launcher.poll()
    assert result is not None and result.exit_code == 0
    assert stranger.poll() is None, "teardown signalled a process that is not the run's"
    assert launcher.stop().exit_code == 0
    assert stranger.poll() is None


def test_process_identity_signals_only_the_process_it_found(stranger):
    found = ProcessIdentity.of(psutil.Process(stranger.pid))
    assert found is not None and found.alive()
    other = ProcessIdentity(stranger.pid, found.create_time + 1.0)  # same pid, another process
    assert not other.alive()
    assert other.signal(signal.SIGTERM) is False
    assert stranger.poll() is None
    assert found.signal(signal.SIGTERM) is True
    assert stranger.wait(timeout=30) == -signal.SIGTERM
    assert not found.alive()
    assert found.signal(signal.SIGTERM) is False  # gone (reaped): nothing to signal
